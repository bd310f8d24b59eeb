/*
 * test_faults.c — patd under client and daemon failures, with real processes:
 *   - a client SIGKILLed mid-step, 24 times at three different points: its session reclaimed
 *     within 1 s, a bystander client's checked steps unaffected, no block leaked;
 *   - SIGTERM while clients are stepping: they get a clean error and exit within 5 s, patd
 *     drains and exits 0;
 *   - patd killed and restarted: the client library reports the loss and reconnects;
 *   - a lease that expires, a step that times out, a pool and a connection table that run out;
 *   - a step begun while the one executor is busy, answered after the client's timeout: libpat
 *     ends it, and the session's next step runs at once;
 *   - sessions that begin a step and never hand a layer over, as many as there are executors
 *     and twice as many: a bystander's checked steps go on at (nearly) its unhindered rate;
 *   - a client that tries to truncate its own staging buffer: it is a sealed memfd now, the
 *     truncation is refused and the step runs whole (patd used to die of SIGBUS).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "pat.h"
#include "pat_base.h"
#include "tl_client.h"
#include "tl_daemon.h"

static const pat_model_t MODEL = {4, 8, 2, 64, PAT_F16, 16, 0};

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Starts tc_client with args; *ret_out is its stdout. Waits for its "ready" line. */
static pid_t spawn_client(const char *sock, const char *mode, const char *point, FILE **ret_out)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        const char *bin = getenv("TC_CLIENT") ? getenv("TC_CLIENT") : "build/tests/tc_client";
        execl(bin, bin, sock, mode, point, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    FILE *f = fdopen(p[0], "r");
    char line[64] = "";
    if (!fgets(line, sizeof(line), f) || strcmp(line, "ready\n"))
        fail_msg("client %s %s did not get ready ('%s')", mode, point ? point : "", line);
    *ret_out = f;
    return pid;
}

static pat_conn_t *connect_to(tl_daemon_t *d, const char *label)
{
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 512,
                            .max_seqs = 8,
                            .timeout_ms = 10000,
                            .socket = d->sock,
                            .label = label,
                            .model = MODEL};
    pat_conn_t *c = NULL;
    char why[256];
    int rc = pat_connect(&o, &c, why, sizeof(why));
    if (rc < 0)
        fail_msg("connect: %s: %s", pat_strerror(rc), why);
    return c;
}

/* A client with two sequences sharing the fault clients' prompt (tokens from 3000); each call
 * decodes one token, checked against float64 (tl_bystander_t). */
typedef tl_bystander_t bystander_t;

static void by_open(bystander_t *b, tl_daemon_t *d)
{
    char why[256];
    if (tl_by_open(b, d->sock, &MODEL, 3000, why, sizeof(why)) < 0)
        fail_msg("%s", why);
}

static void by_step(bystander_t *b)
{
    char why[256];
    if (tl_by_step(b, why, sizeof(why)) < 0)
        fail_msg("%s", why);
}

static void by_close(bystander_t *b)
{
    tl_by_close(b);
}

static void test_kill_mid_step(void **state)
{
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, NULL), 0);
    bystander_t b;
    by_open(&b, &d);
    by_step(&b);
    uint64_t worst_ns = 0;
    const char *points[3] = {"0", "1", "2"};
    for (int i = 0; i < 24; i++) {
        FILE *out;
        pid_t pid = spawn_client(d.sock, "hold", points[i % 3], &out);
        assert_int_equal(tl_daemon_status(&d, "connections"), 2);
        uint64_t t0 = pat_now_ns();
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fclose(out);
        while (tl_daemon_status(&d, "connections") != 1) {
            if (pat_now_ns() - t0 > 1000000000ull)
                fail_msg("kill %d (point %s): session not reclaimed within 1 s", i, points[i % 3]);
            sleep_ms(2);
        }
        uint64_t dt = pat_now_ns() - t0;
        worst_ns = PAT_MAX(worst_ns, dt);
        assert_int_equal(tl_daemon_status(&d, "steps_in_flight"), 0);
        assert_int_equal(tl_daemon_status(&d, "sequences"), 2); /* the bystander's */
        assert_int_equal(tl_daemon_status(&d, "pool_check"), 0);
        by_step(&b); /* unaffected: checked against float64 */
    }
    printf("reclaim after SIGKILL: worst %.1f ms over 24 kills (limit 1000 ms)\n", worst_ns / 1e6);
    by_close(&b);
    assert_int_equal(tl_daemon_status(&d, "blocks_used"), 0);
    assert_int_equal(tl_daemon_status(&d, "sequences"), 0);
    assert_true(tl_daemon_metric(&d, "patd_reclaims_total{reason=\"client_died\"}") == 24);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

static void test_sigterm_mid_traffic(void **state)
{
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, NULL), 0);
    pid_t pids[3];
    FILE *outs[3];
    for (int i = 0; i < 3; i++)
        pids[i] = spawn_client(d.sock, "loop", NULL, &outs[i]);
    sleep_ms(200);
    uint64_t t0 = pat_now_ns();
    kill(d.pid, SIGTERM);
    for (int i = 0; i < 3; i++) {
        int st = -1;
        while (waitpid(pids[i], &st, WNOHANG) == 0) {
            if (pat_now_ns() - t0 > 5000000000ull) {
                kill(pids[i], SIGKILL);
                fail_msg("client %d still running 5 s after SIGTERM to patd", i);
            }
            sleep_ms(5);
        }
        fclose(outs[i]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("client %d did not stop with a clean error (status %d)", i, st);
    }
    printf("clients out %.0f ms after SIGTERM\n", (pat_now_ns() - t0) / 1e6);
    int rc = tl_daemon_signal_wait(&d, 0, 5000);
    assert_int_equal(rc, 0); /* drained and exited 0 */
    tl_daemon_stop(&d);
}

static void test_restart(void **state)
{
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, NULL), 0);
    bystander_t b;
    by_open(&b, &d);
    by_step(&b);
    /* killed and nothing back yet: the next call says it went away */
    assert_true(tl_daemon_signal_wait(&d, SIGKILL, 5000) >= 0);
    uint64_t t0 = pat_now_ns();
    int rc = pat_ping(b.c);
    assert_int_equal(rc, -ECONNRESET);
    assert_true(pat_now_ns() - t0 < 2000000000ull);
    assert_non_null(strstr(pat_last_error(b.c), "went away"));
    by_close(&b);
    assert_int_equal(tl_daemon_restart(&d, NULL), 0);
    /* killed and restarted between two steps: the next call says it restarted (-ESTALE, not a
     * refusal or a hiccup), 100 times out of 100, and a new session is with another instance */
    uint32_t detected = 0;
    for (int i = 0; i < 100; i++) {
        by_open(&b, &d);
        by_step(&b);
        uint64_t start_s = 0, was = pat_instance(b.c, &start_s);
        assert_true(was != 0 && start_s != 0);
        assert_true(tl_daemon_signal_wait(&d, SIGKILL, 5000) >= 0);
        assert_int_equal(tl_daemon_restart(&d, NULL), 0);
        tl_step_result_t r;
        rc = tl_client_step(b.c, &MODEL, b.ps, 2, &b.rng, 1, &r);
        if (rc == -ESTALE && strstr(pat_last_error(b.c), "restarted"))
            detected++;
        else
            printf("restart %d: %s (%s)\n", i, pat_strerror(rc), pat_last_error(b.c));
        assert_int_equal(pat_ping(b.c), -ESTALE); /* and it stays so */
        by_close(&b);
        by_open(&b, &d);
        assert_true(pat_instance(b.c, NULL) != was);
        if (i == 99) { /* a fresh connection works; the new daemon's cache starts empty */
            assert_int_equal(b.s[0].cached, 0);
            by_step(&b);
            by_step(&b);
        }
        by_close(&b);
    }
    printf("restart between two steps detected %u times out of 100\n", detected);
    assert_int_equal(detected, 100);
    assert_int_equal(tl_daemon_status(&d, "pool_check"), 0);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* An idle session open while patd drains is ended with the daemon: its next call says the
 * daemon shut down (-ESHUTDOWN), not that it vanished (-ECONNRESET) */
static void test_idle_session_drain(void **state)
{
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, NULL), 0);
    bystander_t b;
    by_open(&b, &d);
    by_step(&b);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0); /* drained, exited 0 */
    tl_step_result_t r;
    int rc = tl_client_step(b.c, &MODEL, b.ps, 2, &b.rng, 1, &r);
    if (rc != -ESHUTDOWN || !strstr(pat_last_error(b.c), "shut down"))
        fail_msg("idle session after a drain: %s (%s)", pat_strerror(rc), pat_last_error(b.c));
    assert_int_equal(pat_ping(b.c), -ESHUTDOWN);
    by_close(&b);
    tl_daemon_stop(&d);
}

static void test_lease_and_step_timeout(void **state)
{
    tl_daemon_t d;
    static const char *const args[] = {"--liveness=lease", "--lease-ms=300",
                                       "--step-timeout-ms=300", NULL};
    assert_int_equal(tl_daemon_start(&d, args), 0);
    bystander_t b;
    by_open(&b, &d);
    by_step(&b);
    /* a step whose client stops handing over layers is aborted after the step timeout */
    uint32_t sid[2] = {b.s[0].seq, b.s[1].seq}, nn[2] = {1, 1};
    uint32_t tok[2] = {b.s[0].tok[b.s[0].n_tok - 1], b.s[1].tok[b.s[1].n_tok - 1]};
    assert_int_equal(pat_step_begin(b.c, sid, nn, 2, tok), 0);
    assert_int_equal(pat_attend(b.c, 0), 0);
    sleep_ms(600);
    assert_int_equal(pat_attend(b.c, 1), -ETIMEDOUT);
    assert_int_equal(pat_step_end(b.c, 0, NULL), -ETIMEDOUT);
    assert_int_equal(tl_daemon_metric(&d, "patd_steps_failed_total"), 1);
    by_step(&b); /* the session goes on: the failed step left nothing behind */
    /* idle longer than the lease: the session is reclaimed */
    sleep_ms(800);
    assert_int_equal(tl_daemon_status(&d, "connections"), 0);
    assert_int_equal(tl_daemon_status(&d, "sequences"), 0);
    assert_int_equal(pat_ping(b.c), -ENOTCONN);
    assert_non_null(strstr(pat_last_error(b.c), "expired"));
    by_close(&b);
    assert_int_equal(tl_daemon_metric(&d, "patd_reclaims_total{reason=\"lease_expired\"}"), 1);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* A host session whose STEP_BEGIN is answered only after its timeout (the one executor busy
 * with another session's long layer): its first pat_attend gets -ETIMEDOUT, and pat_step_end
 * collects the late answer and ends the step the daemon holds (tried again while it says
 * -ETIMEDOUT). libpat used to drop the owed answer and go idle, and the session's next step met
 * EBUSY until the daemon's step timeout. */
static void test_late_step_begin(void **state)
{
    tl_daemon_t d;
    static const char *const args[] = {"--executors=1", "--step-timeout-ms=60000", NULL};
    assert_int_equal(tl_daemon_start(&d, args), 0);
    enum { HOG = 4096 };
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t hog = fork();
    assert_true(hog >= 0);
    if (hog == 0) { /* one 4096-token prefill layer: a second or more on the cpu backend */
        close(p[0]);
        pat_conn_t *c;
        char why[256];
        tl_seq_t s;
        tl_seq_init(&s);
        for (uint32_t t = 0; t < HOG; t++)
            tl_seq_push(&s, 200000 + t);
        if (tl_connect(d.sock, &MODEL, "hog", HOG, 60000, &c, why, sizeof(why)) < 0 ||
            tl_seq_open(c, &s) < 0)
            _exit(2);
        uint32_t n = HOG;
        if (pat_step_begin(c, &s.seq, &n, 1, s.tok) < 0 || write(p[1], "g", 1) != 1)
            _exit(3);
        int rc = pat_attend(c, 0);
        pat_step_end(c, 1, NULL);
        _exit(rc < 0 ? 4 : 0);
    }
    close(p[1]);
    char g;
    assert_int_equal(read(p[0], &g, 1), 1);
    close(p[0]);
    sleep_ms(50); /* its layer is on the executor now */
    pat_conn_t *c;
    char why[256];
    tl_seq_t s;
    tl_seq_init(&s);
    for (uint32_t t = 0; t < 20; t++)
        tl_seq_push(&s, 300000 + t);
    assert_int_equal(tl_connect(d.sock, &MODEL, "late", 64, 100, &c, why, sizeof(why)), 0);
    assert_int_equal(tl_seq_open(c, &s), 0);
    uint32_t n = s.n_tok;
    assert_int_equal(pat_step_begin(c, &s.seq, &n, 1, s.tok), 0);
    assert_int_equal(pat_attend(c, 0), -ETIMEDOUT);
    assert_non_null(strstr(pat_last_error(c), "STEP_BEGIN"));
    assert_int_equal(pat_ping(c), -ETIMEDOUT); /* no other request while the answer is owed */
    int rc;
    uint64_t t0 = pat_now_ns();
    while ((rc = pat_step_end(c, 1, NULL)) == -ETIMEDOUT && pat_now_ns() - t0 < 60000000000ull)
        ;
    assert_int_equal(rc, 0);
    int st;
    assert_int_equal(waitpid(hog, &st, 0), hog);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* the session goes on at once: a checked step over the same sequence */
    tl_rng_t rng;
    tl_rng_seed(&rng, 7);
    tl_seq_t *ps = &s;
    tl_step_result_t res;
    assert_int_equal(tl_client_step(c, &MODEL, &ps, 1, &rng, 1, &res), 0);
    assert_int_equal(pat_ping(c), 0);
    pat_close(c);
    tl_seq_done(&s);
    assert_int_equal(tl_daemon_status(&d, "connections"), 0);
    assert_int_equal(tl_daemon_status(&d, "blocks_used"), 0);
    assert_int_equal(tl_daemon_status(&d, "pool_check"), 0);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* Bystander steps per second over `steps` steps from fresh sequences (every row checked against
 * float64): each measurement starts at the same context length, since a step's cost grows with
 * it. The median of three runs. */
static double by_rate(bystander_t *b, uint32_t steps)
{
    double r[3];
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 2; i++) { /* the same prompt again (cached), nothing generated yet */
            assert_int_equal(pat_seq_close(b->c, b->s[i].seq), 0);
            tl_seq_done(&b->s[i]);
            tl_seq_init(&b->s[i]);
            for (uint32_t t = 0; t < 64; t++)
                tl_seq_push(&b->s[i], 3000 + t);
            tl_seq_push(&b->s[i], 90 + (uint32_t)i);
            assert_int_equal(tl_seq_open(b->c, &b->s[i]), 0);
        }
        uint64_t t0 = pat_now_ns();
        for (uint32_t n = 0; n < steps; n++)
            by_step(b);
        r[k] = steps / ((pat_now_ns() - t0) / 1e9);
    }
    double lo = PAT_MIN(r[0], PAT_MIN(r[1], r[2])), hi = PAT_MAX(r[0], PAT_MAX(r[1], r[2]));
    return r[0] + r[1] + r[2] - lo - hi;
}

/* A session that begins a step and never hands a layer over. */
static pat_conn_t *stall_one(tl_daemon_t *d, tl_seq_t *s, uint32_t k)
{
    pat_conn_t *c = connect_to(d, "staller");
    tl_seq_init(s);
    for (uint32_t t = 0; t < 32; t++)
        tl_seq_push(s, 5000 + k * 100 + t);
    assert_int_equal(tl_seq_open(c, s), 0);
    uint32_t n_new = s->n_tok;
    assert_int_equal(pat_step_begin(c, &s->seq, &n_new, 1, s->tok), 0);
    return c;
}

static void test_stalled_sessions(void **state)
{
    tl_daemon_t d;
    static const char *const args[] = {"--executors=2", "--step-timeout-ms=60000", NULL};
    assert_int_equal(tl_daemon_start(&d, args), 0);
    bystander_t b;
    by_open(&b, &d);
    by_step(&b);
    /* the median of 3 windows alone; with stalls the best of up to 5: a loaded machine's rate
     * swings by tens of percent from window to window, the failure guarded against is 0 steps/s
     * for the 60 s step timeout */
    double a3[3];
    for (int w = 0; w < 3; w++)
        a3[w] = by_rate(&b, 60);
    double alone = PAT_MAX(PAT_MIN(a3[0], a3[1]), PAT_MIN(PAT_MAX(a3[0], a3[1]), a3[2]));
    pat_conn_t *st[4];
    tl_seq_t ss[4];
    double with[2];
    for (uint32_t round = 0; round < 2; round++) {
        uint32_t n = round ? 4 : 2; /* as many stalled steps as executors, then twice as many */
        for (uint32_t k = round ? 2 : 0; k < n; k++)
            st[k] = stall_one(&d, &ss[k], k);
        for (uint64_t t0 = pat_now_ns();
             tl_daemon_status(&d, "steps_in_flight") < n && pat_now_ns() - t0 < 2000000000ull;)
            sleep_ms(5);
        assert_true(tl_daemon_status(&d, "steps_in_flight") >= n);
        with[round] = 0;
        for (int w = 0; w < 5 && with[round] < 0.9 * alone; w++) {
            double r = by_rate(&b, 60);
            with[round] = r > with[round] ? r : with[round];
        }
        printf("bystander: %.0f steps/s alone, %.0f with %u stalled sessions (%.0f%%)\n", alone,
               with[round], n, 100.0 * with[round] / alone);
    }
    /* executors used to wait for a stalled client for the whole step timeout: 0 steps/s here.
     * Measured on a quiet machine: 96-99 % and 91-103 %
     * (tests/bench/log/2026-11-25-stalled-client.md); CI's loaded 2-core machine gets a looser
     * bound than the 90 % target, looser still under ASan (80-84 % measured there while another
     * build ran) */
#if defined(__SANITIZE_ADDRESS__)
    const double bound = 0.5;
#else
    const double bound = 0.75;
#endif
    assert_true(with[0] >= bound * alone);
    assert_true(with[1] >= bound * alone);
    for (uint32_t k = 0; k < 4; k++) { /* their sessions end: the stalled steps are reclaimed */
        pat_close(st[k]);
        tl_seq_done(&ss[k]);
    }
    by_step(&b);
    by_close(&b);
    assert_int_equal(tl_daemon_status(&d, "connections"), 0);
    assert_int_equal(tl_daemon_status(&d, "blocks_used"), 0);
    assert_int_equal(tl_daemon_status(&d, "pool_check"), 0);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* The file /proc/self/maps shows mapped at addr ("" if none), and its mapping's range. */
static void mapped_file(const void *addr, char *path, size_t cap, uintptr_t *ret_lo,
                        uintptr_t *ret_hi)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512];
    path[0] = 0;
    while (fgets(line, sizeof(line), f)) {
        uintptr_t lo, hi;
        char file[400] = "";
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %*s %*s %399s", &lo, &hi, file) >= 2 &&
            (uintptr_t)addr >= lo && (uintptr_t)addr < hi) {
            snprintf(path, cap, "%s", file);
            *ret_lo = lo;
            *ret_hi = hi;
            break;
        }
    }
    fclose(f);
}

/* A client that tries to shrink or grow its staging buffer under the daemon. It used to be a
 * named shm file any member of the socket group could open and truncate: patd died of SIGBUS
 * (then, with the SIGBUS guard, the session got -EFAULT). Now it is a sealed memfd with no name:
 * even the client that maps it, reopening it through /proc/self/map_files (root only), gets
 * EPERM from ftruncate, and its step goes on whole. */
static void test_truncated_staging(void **state)
{
    tl_daemon_t d;
    static const char *const args[] = {NULL};
    assert_int_equal(tl_daemon_start(&d, args), 0);
    bystander_t b;
    by_open(&b, &d);
    by_step(&b);
    tl_seq_t s;
    pat_conn_t *c = stall_one(&d, &s, 9);
    pat_buffers_t buf;
    assert_int_equal(pat_buffers(c, &buf), 0);
    char path[400];
    uintptr_t lo = 0, hi = 0;
    mapped_file(buf.k, path, sizeof(path), &lo, &hi);
    assert_non_null(strstr(path, "memfd:patd-staging")); /* no name in /dev/shm */
    char mf[128];
    snprintf(mf, sizeof(mf), "/proc/self/map_files/%" PRIxPTR "-%" PRIxPTR, lo, hi);
    int fd = open(mf, O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        assert_int_equal(ftruncate(fd, 4096), -1);
        assert_int_equal(errno, EPERM);
        assert_int_equal(ftruncate(fd, (off_t)(hi - lo) * 4), -1);
        assert_int_equal(errno, EPERM);
        close(fd);
    } else {
        printf("map_files needs CAP_SYS_ADMIN: the reopen is skipped (%s)\n", strerror(errno));
    }
    assert_int_equal(pat_attend(c, 0), 0); /* the buffer is whole: the layer runs */
    pat_step_end(c, 1, NULL);
    by_step(&b);
    pat_close(c);
    tl_seq_done(&s);
    by_step(&b);
    by_close(&b);
    assert_int_equal(tl_daemon_status(&d, "connections"), 0);
    assert_int_equal(tl_daemon_status(&d, "blocks_used"), 0);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

static void test_exhaustion(void **state)
{
    tl_daemon_t d;
    static const char *const args[] = {"--blocks=64", "--max-conns=2", NULL};
    assert_int_equal(tl_daemon_start(&d, args), 0);
    pat_conn_t *c = connect_to(&d, "big"), *c2 = connect_to(&d, "second");
    pat_connect_opts_t o = {
        .size = sizeof(o), .max_batch_tokens = 16, .socket = d.sock, .model = MODEL};
    pat_conn_t *c3 = NULL;
    char why[256];
    assert_int_equal(pat_connect(&o, &c3, why, sizeof(why)), -EMFILE);
    pat_close(c2);
    tl_rng_t rng;
    tl_rng_seed(&rng, 3);
    tl_seq_t s[3], *one[1];
    tl_step_result_t r;
    for (int i = 0; i < 3; i++) { /* 512 distinct tokens each: 32 blocks */
        tl_seq_init(&s[i]);
        for (uint32_t t = 0; t < 512; t++)
            tl_seq_push(&s[i], 100000 * (uint32_t)(i + 1) + t);
        assert_int_equal(tl_seq_open(c, &s[i]), 0);
        one[0] = &s[i];
        int rc = tl_client_step(c, &MODEL, one, 1, &rng, 0, &r);
        assert_int_equal(rc, i < 2 ? 0 : -ENOSPC);
    }
    assert_int_equal(tl_daemon_status(&d, "blocks_free"), 0);
    /* free one: its published blocks stay cached but are reclaimable; the third fits now */
    assert_int_equal(pat_seq_close(c, s[0].seq), 0);
    one[0] = &s[2];
    assert_int_equal(tl_client_step(c, &MODEL, one, 1, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    pat_close(c);
    for (int i = 0; i < 3; i++)
        tl_seq_done(&s[i]);
    assert_int_equal(tl_daemon_status(&d, "pool_check"), 0);
    assert_int_equal(tl_daemon_status(&d, "blocks_used"), 0);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_mid_step),
        cmocka_unit_test(test_sigterm_mid_traffic),
        cmocka_unit_test(test_restart),
        cmocka_unit_test(test_idle_session_drain),
        cmocka_unit_test(test_lease_and_step_timeout),
        cmocka_unit_test(test_late_step_begin),
        cmocka_unit_test(test_exhaustion),
        cmocka_unit_test(test_stalled_sessions),
        cmocka_unit_test(test_truncated_staging),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
