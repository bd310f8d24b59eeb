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

/* In the child before exec: $NOTIFY_SOCKET, and the store given back from descriptor 3 on. */
static int managed_child(tl_daemon_t *d)
{
    setenv("NOTIFY_SOCKET", d->notify_path, 1);
    if (d->n_store == 0)
        return 0;
    int high[TL_STORE_MAX];
    char names[TL_STORE_MAX * 65] = "";
    for (int i = 0; i < d->n_store; i++) /* out of the way of 3.. first */
        if ((high[i] = fcntl(d->store_fd[i], F_DUPFD, 100)) < 0)
            return -1;
    for (int i = 0; i < d->n_store; i++) {
        if (dup2(high[i], 3 + i) != 3 + i)
            return -1;
        close(high[i]);
        if (i)
            strcat(names, ":");
        strcat(names, d->store_name[i]);
    }
    char pid[24], n[8];
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    snprintf(n, sizeof(n), "%d", d->n_store);
    setenv("LISTEN_PID", pid, 1);
    setenv("LISTEN_FDS", n, 1);
    setenv("LISTEN_FDNAMES", names, 1);
    return 0;
}

static void store_drop(tl_daemon_t *d, const char *name)
{
    for (int i = 0; i < d->n_store;)
        if (!strcmp(d->store_name[i], name)) {
            close(d->store_fd[i]);
            d->n_store--;
            d->store_fd[i] = d->store_fd[d->n_store];
            memcpy(d->store_name[i], d->store_name[d->n_store], sizeof(d->store_name[i]));
        } else
            i++;
}

static void store_add(tl_daemon_t *d, const char *name, int fd)
{
    struct stat a, b;
    for (int i = 0; i < d->n_store; i++)
        if (fstat(fd, &a) == 0 && fstat(d->store_fd[i], &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            close(fd); /* systemd keeps one descriptor of a file */
            return;
        }
    if (d->n_store == TL_STORE_MAX) {
        close(fd);
        return;
    }
    d->store_fd[d->n_store] = fd;
    snprintf(d->store_name[d->n_store], sizeof(d->store_name[0]), "%s", name);
    d->n_store++;
}

int tl_daemon_collect(tl_daemon_t *d)
{
    int got = 0;
    for (;;) {
        char buf[1024];
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(TL_STORE_MAX * sizeof(int))];
        } ctl;
        struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = ctl.b,
                           .msg_controllen = sizeof(ctl.b)};
        ssize_t k = recvmsg(d->notify_fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (k < 0)
            return got;
        buf[k] = 0;
        got++;
        int fds[TL_STORE_MAX], nfd = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                nfd = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                memcpy(fds, CMSG_DATA(c), (size_t)nfd * sizeof(int));
            }
        char name[64] = "unknown";
        const char *fn = strstr(buf, "FDNAME=");
        if (fn)
            snprintf(name, sizeof(name), "%.*s", (int)strcspn(fn + 7, "\n"), fn + 7);
        if (strstr(buf, "READY=1"))
            d->ready = 1;
        if (strstr(buf, "FDSTOREREMOVE=1"))
            store_drop(d, name);
        for (int i = 0; i < nfd; i++) {
            if (strstr(buf, "FDSTORE=1"))
                store_add(d, name, fds[i]);
            else
                close(fds[i]);
        }
    }
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
        if (d->managed && managed_child(d) < 0)
            _exit(125);
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

int tl_daemon_start_in(tl_daemon_t *d, const char *const *args, const char *procs)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/patd-test.XXXXXX");
    if (!mkdtemp(d->dir))
        return -1;
    snprintf(d->sock, sizeof(d->sock), "%s/patd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/patd.log", d->dir);
    return spawn(d, args, procs);
}

int tl_daemon_start_managed(tl_daemon_t *d, const char *const *args)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/patd-test.XXXXXX");
    if (!mkdtemp(d->dir))
        return -1;
    snprintf(d->sock, sizeof(d->sock), "%s/patd.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/patd.log", d->dir);
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
    if (d->managed) {
        tl_daemon_collect(d); /* what the last one sent before it died */
        d->ready = 0;
    }
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
        for (int i = 0; i < d->n_store; i++)
            close(d->store_fd[i]);
        d->n_store = 0;
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
