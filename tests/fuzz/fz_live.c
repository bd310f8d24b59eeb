/*
 * fz_live.c — the live patd of a transport-level fuzz run and the checks asked of it (fz_live.h).
 * The descriptor count and CPU time come from /proc/<pid>; liveness is asked through libpat, as a
 * real client would: pat_status on the admin socket, pat_ping on the control socket.
 */
#include "fz_live.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fz_mutate.h"

#define FZ_IDLE_WIN_MS 250u /* one window of the idle CPU check */

uint64_t fz_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void fz_sleep_ms(uint32_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* the one that runs now: the exit handler kills it */
static fz_live_t *g_live;

static int free_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int fz_fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return -errno;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* utime + stime of every thread, in clock ticks, or -1 */
static long long cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the name may hold spaces; fields follow its ')' */
    long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lld %lld", &ut, &st) != 2)
        return -1;
    return ut + st;
}

int fz_live_dead(fz_live_t *L)
{
    if (!L->up || L->d.pid <= 0)
        return 1;
    int st;
    if (waitpid(L->d.pid, &st, WNOHANG) != L->d.pid)
        return 0;
    L->exit_status = st;
    L->d.pid = 0;
    return 1;
}

void fz_describe_status(int st, char *out, size_t n)
{
    if (WIFSIGNALED(st))
        snprintf(out, n, "killed by signal %d (%s)%s", WTERMSIG(st), strsignal(WTERMSIG(st)),
                 WCOREDUMP(st) ? ", core dumped" : "");
    else
        snprintf(out, n, "exited with status %d", WEXITSTATUS(st));
}

static int session_open(fz_live_t *L, uint32_t timeout_ms, pat_conn_t **ret, char *why, size_t wl)
{
    pat_connect_opts_t co = {.size = sizeof(co),
                             .max_batch_tokens = 16,
                             .timeout_ms = timeout_ms,
                             .socket = L->d.sock,
                             .label = "fuzz-sockets"};
    memcpy(&co.model, &L->model, sizeof(co.model));
    return pat_connect(&co, ret, why, wl);
}

void fz_live_stop(fz_live_t *L)
{
    if (!L->up)
        return;
    pat_close(L->standing); /* a daemon gone: libpat's watcher knows, no BYE is waited for */
    L->standing = NULL;
    if (L->pidfd >= 0)
        close(L->pidfd);
    L->pidfd = -1;
    tl_daemon_stop(&L->d);
    L->up = 0;
    if (g_live == L)
        g_live = NULL;
}

static int start_once(fz_live_t *L, const fz_live_opts_t *o)
{
    memset(L, 0, sizeof(*L));
    L->pidfd = -1;
    const int port = free_port();
    if (port <= 0)
        return -EADDRNOTAVAIL;
    char port_arg[48];
    snprintf(port_arg, sizeof(port_arg), "--metrics-port=%d", port);
    const char *args[4 + FZ_MAX_DARGS] = {"--backend=cpu", port_arg, "--log-level=warning"};
    for (uint64_t i = 0; i < o->n_dargs; i++)
        args[3 + i] = o->dargs[i];
    L->up = 1; /* from here on fz_live_stop cleans up (the directory exists) */
    g_live = L;
    if (tl_daemon_start(&L->d, args) < 0) {
        fz_live_stop(L);
        return -ECHILD;
    }
    L->pidfd = (int)syscall(SYS_pidfd_open, L->d.pid, 0);
    snprintf(L->ep.dir, sizeof(L->ep.dir), "%s", L->d.dir);
    L->ep.port = (uint16_t)port;
    pat_status_t st = {.size = sizeof(st)};
    char why[256] = "";
    int rc = pat_status(L->d.sock, (uint32_t)o->answer_ms, &st);
    if (rc == 0) {
        memcpy(&L->model, &st.model, sizeof(L->model));
        rc = session_open(L, (uint32_t)o->answer_ms, &L->standing, why, sizeof(why));
    }
    if (rc < 0 || L->pidfd < 0) {
        fprintf(stderr, "fuzz_sockets: patd started but %s: %s %s\n",
                L->pidfd < 0 ? "no pidfd" : "no session", pat_strerror(rc), why);
        fz_live_stop(L);
        return rc < 0 ? rc : -ECHILD;
    }
    L->baseline_fds = L->max_fds = fz_fd_count(L->d.pid);
    return 0;
}

int fz_live_start(fz_live_t *L, const fz_live_opts_t *o)
{
    _Static_assert(sizeof(pat_model_t) == sizeof(ipc_model_sig_t), "pat_model_t is the wire's");
    /* the free port is free when asked, not always when patd binds it: three tries */
    int rc = -ECHILD;
    for (int i = 0; i < 3 && rc < 0; i++)
        rc = start_once(L, o);
    return rc;
}

void fz_live_log_tail(const fz_live_t *L, int lines)
{
    char b[16384];
    int fd = open(L->d.log, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    const off_t size = lseek(fd, 0, SEEK_END);
    const off_t from = size > (off_t)sizeof(b) ? size - (off_t)sizeof(b) : 0;
    const ssize_t n = pread(fd, b, sizeof(b), from);
    close(fd);
    if (n <= 0)
        return;
    ssize_t at = n;
    int seen = 0;
    while (at > 0 && seen <= lines)
        seen += b[--at] == '\n';
    fprintf(stderr, "---- patd log (last lines) ----\n%.*s%s------------------------------\n",
            (int)(n - at), b + at, b[n - 1] != '\n' ? "\n" : "");
}

void fz_live_log_trim(const fz_live_t *L, uint64_t max_bytes)
{
    /* patd appends (O_APPEND): truncating under it is safe, its next line starts the file */
    struct stat st;
    if (stat(L->d.log, &st) == 0 && (uint64_t)st.st_size > max_bytes && truncate(L->d.log, 0) == 0)
        fprintf(stderr, "fuzz_sockets: patd's log passed %" PRIu64 " MiB; truncated\n",
                max_bytes >> 20);
}

/* ------------------------------------------------------------------ checks */
/* The daemon's descriptors, at most the start's + slack once nothing is open but the standing
 * session; a surplus gets settle_ms to drain (closes the daemon has not processed yet). */
int fz_check_fds(fz_live_t *L, const fz_live_opts_t *o, uint32_t settle_ms, char *why, size_t wl)
{
    const int bound = L->baseline_fds + (int)o->fd_slack;
    const uint64_t until = fz_now_ms() + settle_ms;
    int n;
    for (;;) {
        n = fz_fd_count(L->d.pid);
        if (n > L->max_fds)
            L->max_fds = n;
        if (n < 0 || n <= bound || fz_now_ms() >= until)
            break;
        fz_sleep_ms(50);
    }
    if (n > bound) {
        snprintf(why, wl,
                 "fd leak: the daemon holds %d descriptors with no client but the "
                 "standing session (%d at start, bound %d)",
                 n, L->baseline_fds, bound);
        return -EMFILE;
    }
    return 0;
}

/* STATUS on the admin socket, PING on the standing session, a new session opened and closed:
 * each answered, all within answer_ms. */
int fz_check_serving(fz_live_t *L, const fz_live_opts_t *o, char *why, size_t wl)
{
    const uint64_t t0 = fz_now_ms();
    const uint32_t bound = (uint32_t)o->answer_ms;
    pat_status_t st = {.size = sizeof(st)};
    char detail[256] = "";
    int rc = pat_status(L->d.sock, bound, &st);
    const char *what = "STATUS";
    if (rc == 0) {
        what = "PING of the standing session";
        rc = pat_ping(L->standing);
    }
    if (rc == 0) {
        what = "a new session";
        pat_conn_t *c = NULL;
        rc = session_open(L, bound, &c, detail, sizeof(detail));
        if (rc == 0)
            rc = pat_ping(c);
        pat_close(c);
    }
    const uint64_t took = fz_now_ms() - t0;
    if (rc < 0) {
        snprintf(why, wl, "not serving: %s failed: %s %s", what, pat_strerror(rc), detail);
        return rc;
    }
    if (took > bound) {
        snprintf(why, wl, "slow: STATUS, PING and a new session took %" PRIu64 " ms (bound %u)",
                 took, bound);
        return -ETIMEDOUT;
    }
    return 0;
}

/* Nobody talks to the daemon: it must go quiet. Windows of FZ_IDLE_WIN_MS until one is below
 * idle_cpu_pct of a core; eight busy ones in a row (2 s) are a spin. Returns the last window's
 * share (percent) or a negative errno. */
int fz_check_idle_cpu(fz_live_t *L, const fz_live_opts_t *o, char *why, size_t wl)
{
    const long hz = sysconf(_SC_CLK_TCK);
    int pct = 0;
    for (int w = 0; w < 8; w++) {
        const long long a = cpu_ticks(L->d.pid);
        const uint64_t t0 = fz_now_ms();
        fz_sleep_ms(FZ_IDLE_WIN_MS);
        const long long b = cpu_ticks(L->d.pid);
        const uint64_t dt = fz_now_ms() - t0;
        if (a < 0 || b < 0)
            return -ESRCH;
        pct = (int)((b - a) * 1000 * 100 / (hz * (long long)(dt ? dt : 1)));
        if (pct <= (int)o->idle_cpu_pct)
            return pct;
    }
    snprintf(why, wl, "spinning: %d%% of a core with no client talking to it (2 s, bound %d%%)",
             pct, (int)o->idle_cpu_pct);
    return -EBUSY;
}

void fz_live_cleanup(void)
{
    if (g_live)
        fz_live_stop(g_live);
}
