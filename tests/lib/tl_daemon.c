/*
 * tl_daemon.c — start, signal and query real patd processes for the integration tests.
 */
#include "tl_daemon.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pat.h"

static void sleep_ms(uint32_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int tl_daemon_collect(tl_daemon_t *d)
{
    int got = 0;
    while (pat_fdstore_recv(&d->store, d->notify_fd) > 0)
        got++;
    if (d->store.mainpid > 0 && d->store.mainpid != d->pid)
        d->pid = d->store.mainpid; /* an upgrade's successor (reaped by a subreaper test) */
    d->store.mainpid = 0;
    return got;
}

static int spawn(tl_daemon_t *d, const char *const *args, const char *procs)
{
    const char *bin = getenv("PATD_BIN") ? getenv("PATD_BIN") : "build/bin/patd";
    char rt[160];
    snprintf(rt, sizeof(rt), "--runtime-dir=%s", d->dir);
    const char *argv[64] = {bin, rt, "--metrics-port=0", "--log-level=debug"};
    int n = 4;
    for (int i = 0; args && args[i] && n < 62; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that dies takes its daemon along */
        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0)
            dup2(fd, 2);
        int cg = procs ? open(procs, O_WRONLY) : -1;
        if (procs && (cg < 0 || write(cg, "0\n", 2) != 2)) { /* "0": the writer itself */
            fprintf(stderr, "moving patd into %s: %s\n", procs, strerror(errno));
            _exit(126);
        }
        if (cg >= 0)
            close(cg);
        if (d->managed) { /* $NOTIFY_SOCKET, and the store given back from descriptor 3 on */
            setenv("NOTIFY_SOCKET", d->notify_path, 1);
            if (pat_fdstore_give(&d->store) < 0)
                _exit(125);
        }
        execv(bin, (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    d->pid = pid;
    for (int i = 0; i < 200; i++) {
        char *t = NULL;
        if (pat_admin(d->sock, PAT_ADMIN_STATUS, 200, &t) == 0) {
            pat_free(t);
            return 0;
        }
        pat_free(t);
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            fprintf(stderr, "patd exited at start (status %d); log %s:\n", st, d->log);
            d->pid = 0;
            char cmd[256];
            snprintf(cmd, sizeof(cmd), "cat %s >&2", d->log);
            if (system(cmd) < 0)
                perror("system");
            return -1;
        }
        sleep_ms(25);
    }
    fprintf(stderr, "patd did not answer within 5 s\n");
    return -1;
}

int tl_daemon_start(tl_daemon_t *d, const char *const *args)
{
    return tl_daemon_start_in(d, args, NULL);
}

int tl_daemon_dir(tl_daemon_t *d)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/patd-test.XXXXXX");
    if (!mkdtemp(d->dir))
        return -1;
    snprintf(d->sock, sizeof(d->sock), "%s/patd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/patd.log", d->dir);
    return 0;
}

int tl_daemon_start_in(tl_daemon_t *d, const char *const *args, const char *procs)
{
    return tl_daemon_dir(d) < 0 ? -1 : spawn(d, args, procs);
}

int tl_daemon_start_managed(tl_daemon_t *d, const char *const *args)
{
    if (tl_daemon_dir(d) < 0)
        return -1;
    snprintf(d->notify_path, sizeof(d->notify_path), "%s/notify", d->dir);
    d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%.100s", d->notify_path);
    if (d->notify_fd < 0 || bind(d->notify_fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        perror("notify socket");
        return -1;
    }
    d->managed = 1;
    int rc = spawn(d, args, NULL);
    tl_daemon_collect(d);
    return rc;
}

int tl_daemon_restart(tl_daemon_t *d, const char *const *args)
{
    if (d->managed)
        tl_daemon_collect(d); /* what the last one sent before it died */
    int rc = spawn(d, args, NULL);
    if (d->managed)
        tl_daemon_collect(d);
    return rc;
}

int tl_daemon_signal_wait(tl_daemon_t *d, int sig, uint32_t timeout_ms)
{
    if (d->pid <= 0)
        return -1;
    kill(d->pid, sig);
    for (uint32_t t = 0; t <= timeout_ms; t += 10) {
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            d->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        sleep_ms(10);
    }
    return -1;
}

void tl_daemon_stop(tl_daemon_t *d)
{
    if (d->pid > 0) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
    }
    if (d->managed) {
        pat_fdstore_clear(&d->store);
        close(d->notify_fd);
        d->managed = 0;
    }
    if (getenv("PATD_TEST_KEEP_LOGS")) {
        fprintf(stderr, "kept %s\n", d->dir);
        return;
    }
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->dir);
    if (system(cmd) < 0)
        perror("system");
}

static int64_t find_value(const char *text, const char *key, char sep)
{
    size_t kl = strlen(key);
    for (const char *p = text; p && *p;) {
        if (!strncmp(p, key, kl) && p[kl] == sep)
            return strtoll(p + kl + 1, NULL, 10);
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return -1;
}

int64_t tl_daemon_status(tl_daemon_t *d, const char *key)
{
    if (!strcmp(key, "pool_check")) { /* CHECK: 0 ok, 1 failed, -1 unreachable */
        char *t = NULL;
        int rc = pat_admin(d->sock, PAT_ADMIN_CHECK, 5000, &t);
        int64_t v = rc == 0 ? (strstr(t, "pool_check ok") ? 0 : 1) : rc == -EUCLEAN ? 1 : -1;
        pat_free(t);
        return v;
    }
    /* the typed figures: one table of the keys tests ask for */
    pat_status_t st = {.size = sizeof(st)};
    if (pat_status(d->sock, 2000, &st) < 0)
        return -1;
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {
        {"blocks_total", offsetof(pat_status_t, blocks_total)},
        {"blocks_free", offsetof(pat_status_t, blocks_free)},
        {"blocks_used", offsetof(pat_status_t, blocks_used)},
        {"blocks_cached", offsetof(pat_status_t, blocks_cached)},
        {"sequences", offsetof(pat_status_t, sequences)},
        {"connections", offsetof(pat_status_t, connections)},
        {"steps_in_flight", offsetof(pat_status_t, steps_in_flight)},
        {"max_conns", offsetof(pat_status_t, max_conns)},
        {"conn_max_seqs", offsetof(pat_status_t, conn_max_seqs)},
        {"conn_max_blocks", offsetof(pat_status_t, conn_max_blocks)},
        {"conn_max_staging_mb", offsetof(pat_status_t, conn_max_staging_mb)},
        {"lease_ms", offsetof(pat_status_t, lease_ms)},
        {"step_timeout_ms", offsetof(pat_status_t, step_timeout_ms)},
        {"pid", offsetof(pat_status_t, pid)},
    };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        if (!strcmp(key, keys[i].key)) {
            uint32_t v;
            memcpy(&v, (const uint8_t *)&st + keys[i].off, sizeof(v));
            return v;
        }
    fprintf(stderr, "tl_daemon_status: no figure '%s'\n", key);
    return -1;
}

int64_t tl_daemon_metric(tl_daemon_t *d, const char *name)
{
    char *t = NULL;
    int64_t v = -1;
    if (pat_admin(d->sock, PAT_ADMIN_STATS, 2000, &t) == 0)
        v = find_value(t, name, ' ');
    pat_free(t);
    return v;
}
