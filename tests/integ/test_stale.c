/*
 * test_stale.c — where no daemon is: the sockets a `kill -9 patd` leaves (<name>.sock, .events,
 * .admin) and a runtime directory with no socket at all. Every patctl verb says so at once (a
 * nanomsg REQ against a stale socket used to wait out patctl's 10 s timeout): "stale socket"
 * and exit status 3 for the first, "no daemon", the path looked at and exit status 1 for the
 * second, each run in under 100 ms. libpat's pat_connect, pat_status and pat_admin return
 * -ECONNREFUSED / -ENOENT as fast; patload gives up at once too. The probe libpat makes before
 * it connects leaves a live daemon unharmed. patctl and patload --version print pat.h's release
 * and the wire protocol version.
 *
 * The time bound is a correctness bound on a hang (the old failure took the whole timeout), not
 * a performance target: a run over it (but not ten times over: that is a hang) is tried twice
 * more and the best of the three counts, so a scheduling hiccup of a busy two-core machine is not
 * a failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ipc_proto.h" /* IPC_VERSION, for the --version checks */
#include "pat.h"
#include "pat_base.h"
#include "tl_daemon.h"

#define FAST_MS 100 /* a verb's bound where no daemon is: process start and one connect() */
#define LIBPAT_TIMEOUT_MS                                                                          \
    10000 /* what a call is allowed: the answer must come long before it (patctl's default) */

/* patctl, patload: $PATCTL_BIN / $PATLOAD_BIN (make run-tests sets them), else beside patd */
static const char *tool_bin(const char *env, const char *name)
{
    if (getenv(env))
        return getenv(env);
    static char path[2][300];
    char *p = path[strcmp(name, "patctl") != 0];
    snprintf(p, 300, "%s", getenv("PATD_BIN") ? getenv("PATD_BIN") : "build/bin/patd");
    char *slash = strrchr(p, '/');
    snprintf(slash ? slash + 1 : p, 20, "%s", name);
    return p;
}

/* Runs argv (NULL-terminated) with stdout and stderr into out (cap bytes, NUL-terminated);
 * returns the exit status (-1: killed by a signal), its wall time into *ret_ms. */
static int run_argv(const char *const *argv, char *out, size_t cap, double *ret_ms)
{
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    uint64_t t0 = pat_now_ns();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    size_t n = 0;
    ssize_t k;
    while ((k = read(pfd[0], out + n, cap - 1 - n)) > 0 && n + (size_t)k < cap - 1)
        n += (size_t)k;
    if (k > 0)
        n += (size_t)k;
    out[n] = 0;
    close(pfd[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    *ret_ms = (double)(pat_now_ns() - t0) / 1e6;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* patctl --socket sock ARGS (space-separated): its exit status and output, the best wall time
 * of up to three runs into *ret_ms (see the top of the file). */
static int patctl(const char *sock, const char *args, char *out, size_t cap, double *ret_ms)
{
    char words[128];
    snprintf(words, sizeof(words), "%s", args);
    const char *argv[16] = {tool_bin("PATCTL_BIN", "patctl"), "--socket", sock};
    int n = 3;
    for (char *save = NULL, *w = strtok_r(words, " ", &save); w && n < 15;
         w = strtok_r(NULL, " ", &save))
        argv[n++] = w;
    argv[n] = NULL;
    int rc = 0;
    *ret_ms = 1e9;
    for (int tries = 0; tries < 3 && *ret_ms >= FAST_MS && (tries == 0 || *ret_ms < 10 * FAST_MS);
         tries++) {
        double ms;
        rc = run_argv(argv, out, cap, &ms);
        *ret_ms = PAT_MIN(*ret_ms, ms);
    }
    return rc;
}

/* Every verb of patctl (client/patctl.c), and where it goes: the control socket or the admin
 * socket beside it (the path the message names). */
static const struct verb {
    const char *args;
    const char *socket; /* "sock" or "admin" */
} VERBS[] = {
    {"status", "sock"}, {"stats", "sock"},   {"stats --json", "sock"}, {"seqs", "sock"},
    {"drain", "admin"}, {"reload", "admin"}, {"check", "admin"},
};
#define N_VERBS PAT_ARRAY_SIZE(VERBS)

/* The daemon killed: its runtime directory and sockets (group state). */
static tl_daemon_t D;
static char D_ADMIN[200];

static int setup_killed(void **state)
{
    (void)state;
    if (tl_daemon_start(&D, NULL) < 0)
        return -1;
    snprintf(D_ADMIN, sizeof(D_ADMIN), "%s/patd.admin", D.dir);
    if (tl_daemon_signal_wait(&D, SIGKILL, 5000) != 128 + SIGKILL)
        return -1;
    /* what a crashed patd leaves: all three socket files, nothing listening */
    static const char *const files[] = {"patd.sock", "patd.events", "patd.admin"};
    for (size_t i = 0; i < PAT_ARRAY_SIZE(files); i++) {
        char p[256];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", D.dir, files[i]);
        if (stat(p, &st) < 0 || !S_ISSOCK(st.st_mode)) {
            fprintf(stderr, "kill -9 left no socket %s\n", p);
            return -1;
        }
    }
    printf("patd killed; stale sockets in %s\n", D.dir);
    return 0;
}

static int teardown_killed(void **state)
{
    (void)state;
    tl_daemon_stop(&D);
    return 0;
}

/* One verb against the stale sockets: exit status 3, "stale socket" and the socket it found
 * stale, under FAST_MS. */
static void test_verb_stale(void **state)
{
    const struct verb *v = *state;
    char out[4096];
    double ms;
    int rc = patctl(D.sock, v->args, out, sizeof(out), &ms);
    printf("patctl %-12s -> exit %d in %.1f ms: %s", v->args, rc, ms, out);
    if (rc != 3 || !strstr(out, "no daemon (stale socket left by a crashed patd)"))
        fail_msg("patctl %s on a stale socket: exit %d, '%s'", v->args, rc, out);
    assert_non_null(strstr(out, strcmp(v->socket, "admin") ? D.sock : D_ADMIN));
    if (ms >= FAST_MS)
        fail_msg("patctl %s on a stale socket took %.1f ms (bound %d ms)", v->args, ms, FAST_MS);
}

/* One verb where the runtime directory holds no socket: exit status 1, "no daemon" and the path
 * it looked at, never "stale", under FAST_MS. */
static void test_verb_none(void **state)
{
    const struct verb *v = *state;
    char dir[] = "/tmp/patd-nosock.XXXXXX", sock[64], looked[64], out[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(sock, sizeof(sock), "%s/patd.sock", dir);
    snprintf(looked, sizeof(looked), "%s/patd.%s", dir, v->socket);
    double ms;
    int rc = patctl(sock, v->args, out, sizeof(out), &ms);
    rmdir(dir);
    printf("patctl %-12s -> exit %d in %.1f ms: %s", v->args, rc, ms, out);
    if (rc != 1 || !strstr(out, "no daemon") || !strstr(out, looked) || strstr(out, "stale"))
        fail_msg("patctl %s with no socket: exit %d, '%s' (want 'no daemon' and %s)", v->args, rc,
                 out, looked);
    if (ms >= FAST_MS)
        fail_msg("patctl %s with no socket took %.1f ms (bound %d ms)", v->args, ms, FAST_MS);
}

/* libpat itself: a frontend or tool that connects to a crashed daemon hears it at once, with the
 * documented code (pat.h) and a text that says stale; no socket stays -ENOENT. */
static void test_libpat_stale(void **state)
{
    (void)state;
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 16,
                            .timeout_ms = LIBPAT_TIMEOUT_MS,
                            .socket = D.sock,
                            .model = {4, 8, 2, 64, PAT_F16, 16, 0}};
    pat_conn_t *c = NULL;
    char why[256];
    uint64_t t0 = pat_now_ns();
    int rc = pat_connect(&o, &c, why, sizeof(why));
    double ms = (double)(pat_now_ns() - t0) / 1e6;
    printf("pat_connect: %d (%s) in %.2f ms\n", rc, why, ms);
    assert_int_equal(rc, -ECONNREFUSED);
    assert_null(c);
    assert_non_null(strstr(why, "stale socket"));
    assert_true(ms < FAST_MS);
    assert_non_null(strstr(pat_strerror(rc), "stale socket"));

    pat_status_t st = {.size = sizeof(st)};
    t0 = pat_now_ns();
    rc = pat_status(D.sock, LIBPAT_TIMEOUT_MS, &st);
    ms = (double)(pat_now_ns() - t0) / 1e6;
    printf("pat_status: %d in %.2f ms\n", rc, ms);
    assert_int_equal(rc, -ECONNREFUSED);
    assert_true(ms < FAST_MS);

    static const struct {
        pat_admin_op_t op;
        const char *at; /* the socket the detail names */
    } ops[] = {         /* since protocol 8 every admin request goes to the admin socket */
               {PAT_ADMIN_STATUS, D_ADMIN}, {PAT_ADMIN_STATS, D_ADMIN},
               {PAT_ADMIN_SEQS, D_ADMIN},   {PAT_ADMIN_DRAIN, D_ADMIN},
               {PAT_ADMIN_RELOAD, D_ADMIN}, {PAT_ADMIN_CHECK, D_ADMIN}};
    for (size_t i = 0; i < PAT_ARRAY_SIZE(ops); i++) {
        char *text = NULL;
        t0 = pat_now_ns();
        rc = pat_admin(D.sock, ops[i].op, LIBPAT_TIMEOUT_MS, &text);
        ms = (double)(pat_now_ns() - t0) / 1e6;
        printf("pat_admin %d: %d (%s) in %.2f ms\n", (int)ops[i].op, rc, text ? text : "", ms);
        assert_int_equal(rc, -ECONNREFUSED);
        assert_non_null(text);
        assert_non_null(strstr(text, "nothing listens at"));
        assert_non_null(strstr(text, ops[i].at));
        assert_true(ms < FAST_MS);
        pat_free(text);
    }

    o.socket = "/nonexistent/patd.sock";
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), -ENOENT);
    assert_int_equal(pat_status(o.socket, LIBPAT_TIMEOUT_MS, &st), -ENOENT);
    char *text = NULL;
    assert_int_equal(pat_admin(o.socket, PAT_ADMIN_CHECK, LIBPAT_TIMEOUT_MS, &text), -ENOENT);
    assert_non_null(text);
    assert_non_null(strstr(text, "no socket at /nonexistent/patd.admin"));
    pat_free(text);
}

/* patload (pat_status before its replay) against the stale socket: exit status 3 (the daemon
 * is unreachable), saying stale, long before its timeout. */
static void test_patload_stale(void **state)
{
    (void)state;
    const char *argv[] = {tool_bin("PATLOAD_BIN", "patload"),
                          "--socket",
                          D.sock,
                          "--timeout-ms",
                          "10000",
                          "--limit",
                          "4",
                          "tests/traces/azure_conv_sample.csv",
                          NULL};
    char out[4096];
    double ms;
    int rc = run_argv(argv, out, sizeof(out), &ms);
    printf("patload -> exit %d in %.1f ms: %s", rc, ms, out);
    assert_int_equal(rc, 3);
    assert_non_null(strstr(out, "stale socket"));
    assert_true(ms < 2000); /* it reads the trace first; the old wait was its 10 s timeout */
}

/* The probe libpat makes before connecting (a connect and a close, no byte) against a live
 * daemon: 50 of them, then the daemon still answers and a session works. */
static void test_probe_harmless(void **state)
{
    (void)state;
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, NULL), 0);
    pat_status_t st = {.size = sizeof(st)};
    for (int i = 0; i < 50; i++)
        assert_int_equal(pat_status(d.sock, 2000, &st), 0);
    char out[4096];
    double ms;
    assert_int_equal(patctl(d.sock, "status", out, sizeof(out), &ms), 0);
    assert_non_null(strstr(out, "pid "));
    assert_int_equal(patctl(d.sock, "check", out, sizeof(out), &ms), 0);
    assert_non_null(strstr(out, "pool_check ok"));
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 16,
                            .timeout_ms = 5000,
                            .socket = d.sock,
                            .model = st.model};
    pat_conn_t *c = NULL;
    char why[256];
    int rc = pat_connect(&o, &c, why, sizeof(why));
    if (rc < 0)
        fail_msg("connect after 50 probes: %s: %s", pat_strerror(rc), why);
    assert_int_equal(pat_ping(c), 0);
    pat_close(c);
    assert_int_equal(tl_daemon_status(&d, "connections"), 0);
    tl_daemon_stop(&d);
}

/* --version prints pat.h's release and the wire protocol, exits 0; --help names it. */
static void test_versions(void **state)
{
    (void)state;
    static const struct {
        const char *env, *name;
    } tools[] = {{"PATCTL_BIN", "patctl"}, {"PATLOAD_BIN", "patload"}};
    for (size_t i = 0; i < PAT_ARRAY_SIZE(tools); i++) {
        const char *bin = tool_bin(tools[i].env, tools[i].name);
        char want[96], out[8192];
        double ms;
        snprintf(want, sizeof(want), "%s %d.%d.%d (wire protocol %u)\n", tools[i].name,
                 PAT_VERSION_MAJOR, PAT_VERSION_MINOR, PAT_VERSION_PATCH, (unsigned)IPC_VERSION);
        const char *ver[] = {bin, "--version", NULL}, *help[] = {bin, "--help", NULL};
        int rc = run_argv(ver, out, sizeof(out), &ms);
        printf("%s --version -> exit %d: %s", tools[i].name, rc, out);
        assert_int_equal(rc, 0);
        assert_string_equal(out, want);
        assert_int_equal(run_argv(help, out, sizeof(out), &ms), 0);
        if (!strstr(out, "--version"))
            fail_msg("%s --help does not mention --version", tools[i].name);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* each check's line in order with cmocka's (on stderr) */
    /* the verbs against the stale sockets (group state: one killed daemon), then with none */
    struct CMUnitTest stale[N_VERBS + 2], none[N_VERBS],
        alone[] = {
            cmocka_unit_test(test_probe_harmless),
            cmocka_unit_test(test_versions),
        };
    static char names[2][N_VERBS][64];
    for (size_t i = 0; i < N_VERBS; i++) {
        snprintf(names[0][i], 64, "patctl %s: stale socket", VERBS[i].args);
        snprintf(names[1][i], 64, "patctl %s: no socket", VERBS[i].args);
        stale[i] = (struct CMUnitTest){names[0][i], test_verb_stale, NULL, NULL, (void *)&VERBS[i]};
        none[i] = (struct CMUnitTest){names[1][i], test_verb_none, NULL, NULL, (void *)&VERBS[i]};
    }
    stale[N_VERBS] = (struct CMUnitTest)cmocka_unit_test(test_libpat_stale);
    stale[N_VERBS + 1] = (struct CMUnitTest)cmocka_unit_test(test_patload_stale);
    int failed = cmocka_run_group_tests(stale, setup_killed, teardown_killed);
    failed += cmocka_run_group_tests(none, NULL, NULL);
    failed += cmocka_run_group_tests(alone, NULL, NULL);
    const int total = (int)(PAT_ARRAY_SIZE(stale) + PAT_ARRAY_SIZE(none) + PAT_ARRAY_SIZE(alone));
    printf("%d passed, %d failed\n", total - failed, failed);
    return failed ? 1 : 0;
}
