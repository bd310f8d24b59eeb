/*
 * patd_keep.c — patd-keep: keeps patd's descriptor store where no systemd does (pool.persist).
 *
 *   patd-keep [--restart-ms N] -- /usr/local/bin/patd [patd's arguments]
 *
 * Runs patd as its child with $NOTIFY_SOCKET naming a socket of its own, keeps what patd stores
 * there (the KV pool's and the prefix cache index's memfds: FDSTORE=1), and when patd dies by a
 * signal or exits with an error, starts it again after --restart-ms (default 1000) with them
 * (LISTEN_FDS): what systemd does for patd.service with Restart=on-failure and
 * FileDescriptorStoreMax=, and nothing more. SIGTERM, SIGINT and SIGHUP are passed to patd; once
 * patd exits after SIGTERM or SIGINT, or exits 0, patd-keep exits with its status. A patd that
 * dies within 2 s of its start 5 times in a row is not started again (exit 1: a configuration
 * that cannot start is not retried for ever). An upgrade (SIGUSR2 or `patctl upgrade` to patd)
 * names its successor with MAINPID=: patd-keep follows it (it is the subreaper of patd's
 * children, so the successor becomes its child once the old patd exits). Messages: one line each
 * on stderr.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pat_base.h"
#include "pat_fdstore.h"

#define FAST_DEATH_NS (2ull * 1000000000ull)
#define FAST_DEATHS   5

static void usage(FILE *f)
{
    fprintf(f, "usage: patd-keep [--restart-ms N] -- PATD [ARGS...]\n"
               "Keeps patd's KV pool and cache index (pool.persist) where no systemd does: runs "
               "PATD with\nNOTIFY_SOCKET set to its own socket, keeps the descriptors it stores, "
               "and starts it again\nwith them (LISTEN_FDS) when it dies by a signal or an "
               "error exit, after --restart-ms\n(default 1000). SIGTERM, SIGINT, SIGHUP go to "
               "patd; its clean exit ends patd-keep. An upgrade\n(SIGUSR2 or patctl upgrade to "
               "patd) hands over to a successor, which patd-keep then\nkeeps.\n");
}

static pid_t start(char **argv, const char *notify, const pat_fdstore_t *store)
{
    pid_t pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setenv("NOTIFY_SOCKET", notify, 1);
        if (pat_fdstore_give(store) < 0)
            _exit(126);
        execv(argv[0], argv);
        fprintf(stderr, "patd-keep: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

int main(int argc, char **argv)
{
    long restart_ms = 1000;
    int i = 1;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            i++;
            break;
        }
        if (!strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--restart-ms") && i + 1 < argc) {
            char *end;
            restart_ms = strtol(argv[++i], &end, 10);
            if (*end || restart_ms < 0 || restart_ms > 600000) {
                fprintf(stderr, "patd-keep: --restart-ms takes 0..600000\n");
                return 2;
            }
            continue;
        }
        usage(stderr);
        return 2;
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    char **child = argv + i;
    /* its own socket, in the abstract namespace: nothing left on disk */
    char notify[64];
    snprintf(notify, sizeof(notify), "@patd-keep-%d", (int)getpid());
    int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path + 1, notify + 1, strlen(notify) - 1);
    const socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(notify));
    if (sock < 0 || bind(sock, (struct sockaddr *)&a, alen) < 0) {
        fprintf(stderr, "patd-keep: notify socket: %s\n", strerror(errno));
        return 1;
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        fprintf(stderr, "patd-keep: signalfd: %s\n", strerror(errno));
        return 1;
    }
    /* an upgraded patd's successor is the old one's child: it becomes ours when that one exits */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) {
        fprintf(stderr, "patd-keep: PR_SET_CHILD_SUBREAPER: %s\n", strerror(errno));
        return 1;
    }
    pat_fdstore_t store = {0};
    int stopping = 0, fast = 0;
    uint64_t started = pat_now_ns(), restart_at = 0;
    pid_t pid = start(child, notify, &store);
    for (;;) {
        struct pollfd p[2] = {{.fd = sock, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
        int wait_ms = -1;
        if (pid <= 0) {
            const uint64_t now = pat_now_ns();
            wait_ms = now >= restart_at ? 0 : (int)((restart_at - now) / 1000000ull) + 1;
        }
        if (poll(p, 2, wait_ms) < 0 && errno != EINTR)
            return 1;
        while (pat_fdstore_recv(&store, sock) > 0)
            ;
        if (pid > 0 && store.mainpid > 0 && store.mainpid != pid) {
            fprintf(stderr, "patd-keep: patd's main process is now pid %d (an upgrade; was %d)\n",
                    store.mainpid, (int)pid);
            pid = store.mainpid;
        }
        store.mainpid = 0; /* each MAINPID= is followed once */
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
            if (si.ssi_signo != SIGCHLD) {
                if (si.ssi_signo != SIGHUP)
                    stopping = 1;
                if (pid > 0)
                    kill(pid, (int)si.ssi_signo);
                else if (stopping)
                    return 0; /* between two starts: nothing runs */
                continue;
            }
            int st;
            pid_t w;
            while ((w = waitpid(-1, &st, WNOHANG)) > 0) {
                if (w != pid)
                    continue;
                pid = 0;
                while (pat_fdstore_recv(&store, sock) > 0) /* what it sent before it went */
                    ;
                const int clean = WIFEXITED(st) && WEXITSTATUS(st) == 0;
                if (stopping || clean)
                    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                fast = pat_now_ns() - started < FAST_DEATH_NS ? fast + 1 : 0;
                if (WIFSIGNALED(st))
                    fprintf(stderr,
                            "patd-keep: patd (pid %d) died by signal %d; %d descriptors "
                            "kept, starting it again in %ld ms\n",
                            (int)w, WTERMSIG(st), store.n, restart_ms);
                else
                    fprintf(stderr,
                            "patd-keep: patd (pid %d) exited with status %d; starting "
                            "it again in %ld ms\n",
                            (int)w, WEXITSTATUS(st), restart_ms);
                if (fast >= FAST_DEATHS) {
                    fprintf(stderr,
                            "patd-keep: patd died within 2 s of its start %d times in "
                            "a row; not starting it again\n",
                            fast);
                    return 1;
                }
                restart_at = pat_now_ns() + (uint64_t)restart_ms * 1000000ull;
            }
        }
        if (pid <= 0 && pat_now_ns() >= restart_at) {
            started = pat_now_ns();
            pid = start(child, notify, &store);
        }
    }
}
