/*
 * patd_notify.c — sd_notify's datagram protocol on a non-blocking socket (patd_notify.h).
 */
#include "patd_notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "patd_log.h"

int patd_notify_open(patd_notify_t *n)
{
    memset(n, 0, sizeof(*n));
    n->fd = -1;
    const char *e = getenv("NOTIFY_SOCKET");
    if (!e || !*e)
        return 0;
    size_t len = strlen(e);
    if ((e[0] != '/' && e[0] != '@') || len >= sizeof(n->addr.sun_path)) {
        patd_warn("NOTIFY_SOCKET '%s' is not an absolute path or @name; not notifying", e);
        unsetenv("NOTIFY_SOCKET");
        return -EINVAL;
    }
    snprintf(n->env, sizeof(n->env), "%s", e);
    n->addr.sun_family = AF_UNIX;
    memcpy(n->addr.sun_path, e, len);
    if (e[0] == '@')
        n->addr.sun_path[0] = 0; /* abstract namespace */
    n->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (e[0] == '/'));
    n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (n->fd < 0) {
        int rc = -errno;
        patd_warn("notify socket: %s; not notifying", strerror(-rc));
        return rc;
    }
    unsetenv("NOTIFY_SOCKET");
    return 0;
}

void patd_notify_close(patd_notify_t *n)
{
    if (n->fd >= 0)
        close(n->fd);
    n->fd = -1;
}

static int send_text(patd_notify_t *n, const char *text)
{
    if (n->fd < 0)
        return 0;
    ssize_t r = sendto(n->fd, text, strlen(text), MSG_DONTWAIT | MSG_NOSIGNAL,
                       (const struct sockaddr *)&n->addr, n->addr_len);
    if (r >= 0)
        return 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return -EAGAIN;
    return -errno; /* ECONNREFUSED: the manager went away; nothing to do about it here */
}

int patd_notify_ping(patd_notify_t *n, const char *fmt, ...)
{
    char text[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    int rc = send_text(n, text);
    if (rc == -EAGAIN)
        n->dropped++;
    return rc == -EAGAIN ? rc : 0;
}

void patd_notify_state(patd_notify_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(n->pending, sizeof(n->pending), fmt, ap);
    va_end(ap);
    patd_notify_flush(n);
}

void patd_notify_flush(patd_notify_t *n)
{
    if (n->pending[0] && send_text(n, n->pending) != -EAGAIN)
        n->pending[0] = 0;
}

int patd_notify_fds(patd_notify_t *n, const char *name, const int *fds, uint32_t n_fds)
{
    if (n->fd < 0)
        return -ENOTCONN;
    if (!name || !*name || strlen(name) > 255 || strpbrk(name, ":\n") || n_fds == 0 ||
        n_fds > PATD_FDS_MAX)
        return -EINVAL;
    char text[300];
    snprintf(text, sizeof(text), "FDSTORE=1\nFDNAME=%s", name);
    struct iovec iov = {.iov_base = text, .iov_len = strlen(text)};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(PATD_FDS_MAX * sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct msghdr m = {.msg_name = &n->addr,
                       .msg_namelen = n->addr_len,
                       .msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = CMSG_SPACE(n_fds * sizeof(int))};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, n_fds * sizeof(int));
    if (sendmsg(n->fd, &m, MSG_NOSIGNAL) >= 0)
        return 0;
    return errno == EWOULDBLOCK ? -EAGAIN : -errno;
}

uint32_t patd_listen_fds(patd_listen_fd_t *out, uint32_t cap)
{
    const char *pid = getenv("LISTEN_PID"), *nfd = getenv("LISTEN_FDS");
    const char *names = getenv("LISTEN_FDNAMES");
    uint32_t got = 0;
    char *end;
    if (pid && nfd && strtol(pid, &end, 10) == (long)getpid() && !*end) {
        const long k = strtol(nfd, &end, 10);
        if (!*end && k > 0 && k < 4096) {
            const char *nm = names ? names : "";
            for (long i = 0; i < k; i++) {
                const int fd = 3 + (int)i;
                const size_t len = strcspn(nm, ":");
                if (got < cap && fcntl(fd, F_SETFD, FD_CLOEXEC) == 0) {
                    out[got].fd = fd;
                    if (len)
                        snprintf(out[got].name, sizeof(out[got].name), "%.*s", (int)len, nm);
                    else
                        snprintf(out[got].name, sizeof(out[got].name), "unknown");
                    got++;
                } else
                    close(fd);
                nm += len + (nm[len] == ':');
            }
        }
    }
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    return got;
}

void patd_watchdog_init(patd_watchdog_t *w, uint64_t period_ns, uint64_t idle_ns, uint64_t tick_ns)
{
    memset(w, 0, sizeof(*w));
    const uint64_t floor_ns = 3 * idle_ns + 2 * tick_ns;
    w->stuck_ns = period_ns / 2 > floor_ns ? period_ns / 2 : floor_ns;
}

uint32_t patd_watchdog_check(patd_watchdog_t *w, const uint64_t *beats, uint32_t n, uint64_t now,
                             int stopping)
{
    uint32_t stuck = 0;
    for (uint32_t i = 0; i < n && i < PATD_WD_MAX; i++) {
        if (beats[i] != w->seen[i] || !w->moved_ns[i]) {
            w->seen[i] = beats[i];
            w->moved_ns[i] = now;
        }
        stuck += now - w->moved_ns[i] > w->stuck_ns && !stopping;
    }
    return stuck;
}
