/*
 * pat_conn.c — a session's control connection to patd (a Unix stream of frames, ipc_proto.h):
 * the socket, one request and its reply, and whether the daemon still lives.
 *
 * One control connection per session, one request outstanding at a time (the daemon reads the
 * next frame only once it has answered the last): a STEP_BEGIN's answer still to come is
 * collected before anything else is sent (pat_step.c). Every wait is sliced (receive timeout
 * 50 ms): between slices the library checks that the daemon still lives (a pidfd on its pid),
 * so a dead daemon is reported as -ECONNRESET within a slice instead of after the full timeout.
 * A daemon that restarted (another instance answers at the socket) gives -ESTALE instead; both
 * are sticky.
 */
#include "pat_int.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "pat_base.h"

#define RECV_SLICE_MS 50

void pat__set_err(pat_conn_t *c, const char *fmt, ...)
{
    if (!c)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

/* The daemon this session was with is gone (its error text set): once, asks who answers at
 * the socket now. Another instance: the daemon restarted (-ESTALE); none: it went away
 * (-ECONNRESET). Both sticky. */
static void mark_lost(pat_conn_t *c, uint64_t other_instance, uint64_t other_start_ms)
{
    if (c->lost && c->lost_rc)
        return;
    c->lost = 1;
    /* a daemon that drained (SIGTERM, patctl drain) ended the session first and said so in its
     * signal page: that is the cause, whatever answers at the socket now */
    if (!other_instance && !c->gpu && c->shm.base) {
        ipc_sig_t *g = ipc_shm_sig(&c->shm);
        if (atomic_load(&g->state) == IPC_STATE_CLOSED && atomic_load(&g->err) == -ESHUTDOWN) {
            c->lost_rc = -ESHUTDOWN;
            pat__set_err(c,
                         "patd (pid %d) shut down (drained) and ended this session; reconnect once "
                         "it is back",
                         (int)c->daemon_pid);
            return;
        }
    }
    if (!other_instance && c->path[0]) {
        pat_status_t st = {.size = sizeof(st)};
        if (pat_status(c->path, 500, &st) == 0 && st.instance != c->instance) {
            other_instance = st.instance;
            other_start_ms = 0;
        }
    }
    if (other_instance && other_instance != c->instance) {
        c->lost_rc = -ESTALE;
        if (other_start_ms)
            pat__set_err(c,
                         "patd restarted: instance %016llx (started at %llu.%03llu) answers, this "
                         "session was with %016llx (pid %d); its sequences are gone: reconnect",
                         (unsigned long long)other_instance,
                         (unsigned long long)(other_start_ms / 1000),
                         (unsigned long long)(other_start_ms % 1000),
                         (unsigned long long)c->instance, (int)c->daemon_pid);
        else
            pat__set_err(c,
                         "patd restarted: instance %016llx answers, this session was with %016llx "
                         "(pid %d); its sequences are gone: reconnect",
                         (unsigned long long)other_instance, (unsigned long long)c->instance,
                         (int)c->daemon_pid);
    } else {
        c->lost_rc = -ECONNRESET;
        pat__set_err(c, "patd (pid %d) went away; reconnect", (int)c->daemon_pid);
    }
}

/* 1 if the daemon is known gone (c->lost_rc and the error text set). */
int pat__daemon_gone(pat_conn_t *c)
{
    if (atomic_load(&c->lost_async))
        c->lost = 1;
    if (!c->lost) {
        if (c->daemon_pidfd >= 0) {
            struct pollfd p = {c->daemon_pidfd, POLLIN, 0};
            if (poll(&p, 1, 0) == 1)
                c->lost = 1;
        } else if (c->daemon_pid > 0 && kill(c->daemon_pid, 0) < 0 && errno == ESRCH) {
            c->lost = 1;
        }
    }
    if (c->lost && !c->lost_rc)
        mark_lost(c, 0, 0);
    else if (c->lost)
        pat__set_err(c, "%s",
                     c->lost_rc == -ESTALE ? "patd restarted since this session began: reconnect"
                     : c->lost_rc == -ESHUTDOWN ? "patd shut down (drained) and ended this session"
                                                : "patd went away; reconnect");
    return c->lost;
}

/* Waits until fd is ready for ev (POLLIN / POLLOUT) or the deadline passes, in slices between
 * which a session's daemon is checked (c may be NULL): 0, -ETIMEDOUT, or the session's lost_rc. */
static int io_wait(pat_conn_t *c, int fd, short ev, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = pat_now_ns();
        if (now >= deadline_ns)
            return -ETIMEDOUT;
        uint64_t left_ms = (deadline_ns - now) / 1000000ull + 1;
        struct pollfd p = {fd, ev, 0};
        int r = poll(&p, 1, (int)PAT_MIN(left_ms, (uint64_t)RECV_SLICE_MS));
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -errno;
        if (c && pat__daemon_gone(c))
            return c->lost_rc;
    }
}

/* A connection to the control socket at path (non-blocking, close-on-exec). A socket file
 * nothing listens on (what a crashed patd leaves) is refused at once. Returns 0 and *ret_sock,
 * -ENOENT, -ENOTSOCK, -ECONNREFUSED (stale), -ETIMEDOUT (its backlog stayed full), or another
 * errno. */
int pat__open_socket(const char *path, uint32_t timeout_ms, int *ret_sock)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return -errno;
    if (!S_ISSOCK(st.st_mode))
        return -ENOTSOCK;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    const uint64_t deadline = pat_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -errno;
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            *ret_sock = fd;
            return 0;
        }
        int rc = -errno;
        close(fd);
        /* a Unix socket's full backlog: the daemon is alive and busy; try again shortly */
        if (rc != -EAGAIN || pat_now_ns() >= deadline)
            return rc == -EAGAIN ? -ETIMEDOUT : rc;
        usleep(2000);
    }
}

/* Reads exactly n bytes of the control connection before the deadline: 0, -ETIMEDOUT,
 * -ECONNRESET (closed), or the session's lost_rc. */
static int sock_read(pat_conn_t *c, int fd, void *buf, size_t n, uint64_t deadline_ns)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = recv(fd, (uint8_t *)buf + got, n - got, MSG_DONTWAIT);
        if (k > 0) {
            got += (size_t)k;
            continue;
        }
        if (k == 0 || (errno != EAGAIN && errno != EINTR))
            return -ECONNRESET;
        int rc = io_wait(c, fd, POLLIN, deadline_ns);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The control connection closed under a session: its daemon went (or is going: its exit may
 * reach the pidfd a moment after the socket's end), or it ended the connection. */
static int conn_closed(pat_conn_t *c)
{
    if (!c)
        return -ECONNRESET;
    /* a daemon that ended the session itself (a drain, an upgrade's handover, a lease, a cut)
     * says so on its signal page before it closes the connection: no wait for its exit then
     * (an upgraded daemon winds down for a while; its successor already serves) */
    const int ended =
        (c->gpu || c->shm.base) && atomic_load(&conn_sig(c)->state) == IPC_STATE_CLOSED;
    for (int i = 0; i < 10 && !ended && !pat__daemon_gone(c); i++)
        usleep(20000);
    if (pat__daemon_gone(c))
        return c->lost_rc;
    if (ended)
        pat__set_err(
            c,
            "patd (pid %d) ended this session (a drain, an upgrade's handover, a lease or a "
            "cut: its log says which); reconnect",
            (int)c->daemon_pid);
    else
        pat__set_err(c, "patd (pid %d) closed this session's control connection",
                     (int)c->daemon_pid);
    return -ECONNRESET;
}

/* Receives the answer to request corr into *ret (malloc'd: free it). Answers to other requests
 * (one that timed out here and was answered late) are skipped. */
int pat__recv_reply(pat_conn_t *c, int sock, uint64_t corr, uint32_t timeout_ms, void **ret,
                    size_t *ret_len)
{
    const uint64_t deadline = pat_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        ipc_hdr_t h;
        int rc = sock_read(c, sock, &h, sizeof(h), deadline);
        if (rc == -ECONNRESET)
            return conn_closed(c);
        if (rc < 0)
            return rc;
        if (h.magic != IPC_MAGIC || h.version != IPC_VERSION ||
            h.body_len > IPC_MAX_FRAME - sizeof(h)) {
            if (c)
                pat__set_err(c, "the daemon's answer is not a protocol %u frame (%s)",
                             (unsigned)IPC_VERSION,
                             h.magic != IPC_MAGIC       ? "bad magic"
                             : h.version != IPC_VERSION ? "another protocol version"
                                                        : "too long");
            return h.magic == IPC_MAGIC && h.version != IPC_VERSION ? -EPROTONOSUPPORT : -EBADMSG;
        }
        uint8_t *msg = pat_xmalloc(sizeof(h) + h.body_len);
        memcpy(msg, &h, sizeof(h));
        rc = sock_read(c, sock, msg + sizeof(h), h.body_len, deadline);
        if (rc < 0) {
            free(msg);
            return rc == -ECONNRESET ? conn_closed(c) : rc;
        }
        if (ipc_frame_check(msg, sizeof(h) + h.body_len, 1, &h) < 0 || h.corr != corr) {
            free(msg); /* not ours: a stale or damaged answer */
            continue;
        }
        *ret = msg;
        *ret_len = sizeof(h) + h.body_len;
        return 0;
    }
}

/* Sends the frame in b (built by the caller) within timeout_ms. */
int pat__send_frame(pat_conn_t *c, int sock, const ipc_buf_t *b, uint32_t timeout_ms)
{
    const uint64_t deadline = pat_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    size_t sent = 0;
    while (sent < b->len) {
        ssize_t k = send(sock, b->data + sent, b->len - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            sent += (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EINTR)
            return errno == EPIPE || errno == ECONNRESET ? conn_closed(c) : -errno;
        int rc = io_wait(c, sock, POLLOUT, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Checks an answer: 0 and the body, or the daemon's error code (its text into c->err). */
int pat__parse_reply(pat_conn_t *c, const void *msg, size_t len, const void **ret_body,
                     size_t *ret_body_len)
{
    ipc_hdr_t h;
    memcpy(&h, msg, sizeof(h));
    const uint8_t *body = (const uint8_t *)msg + sizeof(h);
    if (h.flags & IPC_F_ERROR) {
        ipc_err_body_t e;
        if (h.body_len != sizeof(e))
            return -EBADMSG;
        memcpy(&e, body, sizeof(e));
        e.msg[sizeof(e.msg) - 1] = 0;
        if (e.code >= 0 || e.code < -4095)
            return -EBADMSG;
        pat__set_err(c, "%s", e.msg);
        /* an answer from another daemon instance than the session's: it restarted (and this
         * session's id reached the new one) */
        if (c && c->instance && e.instance && e.instance != c->instance) {
            c->lost = 1;
            c->lost_rc = 0;
            mark_lost(c, e.instance, e.start_unix_ms);
            return c->lost_rc;
        }
        return e.code;
    }
    *ret_body = body;
    *ret_body_len = h.body_len;
    return 0;
}

/* One request: collect a pending step answer first, send, receive, check. The answer body is
 * copied into out: exactly out_len bytes are expected (0: an empty body), else -EBADMSG.
 * c->transport stays set where no answer came (the request failed here, not by the daemon). */
int pat__call(pat_conn_t *c, uint32_t op, const void *body, size_t len, const void *body2,
              size_t len2, void *out, size_t out_len)
{
    c->transport = 1;
    if (pat__daemon_gone(c))
        return c->lost_rc;
    if (c->gone && op != IPC_OP_HELLO)
        return -ENOTCONN;
    int rc = pat__collect_pending(c);
    if (rc == -ECONNRESET)
        return rc;
    if (c->step_state == ST_SENT)
        return rc; /* STEP_BEGIN's answer still owed (its text in c->err): pat_step_end() first */
    ipc_frame_start(&c->tx, op, 0, ++c->corr, c->session);
    if (c->session)
        ipc_frame_set_key(&c->tx, c->hello.key);
    ipc_frame_put(&c->tx, body, len);
    ipc_frame_put(&c->tx, body2, len2);
    ipc_frame_finish(&c->tx);
    if ((rc = pat__send_frame(c, c->sock, &c->tx, c->timeout_ms)) < 0) {
        if (pat__daemon_gone(c))
            return c->lost_rc;
        pat__set_err(c, "sending %s: %s", ipc_op_name(op), strerror(-rc));
        return rc;
    }
    void *msg;
    size_t n;
    if ((rc = pat__recv_reply(c, c->sock, c->corr, c->timeout_ms, &msg, &n)) < 0) {
        if (rc == -ETIMEDOUT)
            pat__set_err(c, "no answer to %s within %u ms", ipc_op_name(op), c->timeout_ms);
        return rc;
    }
    const void *rb;
    size_t rl;
    c->transport = 0;
    rc = pat__parse_reply(c, msg, n, &rb, &rl);
    if (rc == -ENOTCONN && c->session)
        c->gone = 1;
    if (rc == 0 && out_len != rl)
        rc = -EBADMSG;
    if (rc == 0 && out_len)
        memcpy(out, rb, out_len);
    free(msg);
    return rc;
}
