/*
 * pat_admin.c — libpat on patd's admin socket (<name>.admin beside the control socket
 * <name>.sock), where the daemon knows who asks (SO_PEERCRED): the HELLO that opens a session,
 * tried again with backoff while patd is busy, and the admin requests (pat_admin, pat_status).
 * Where no daemon answers they say so at once: -ENOENT (no socket at the path) or -ECONNREFUSED
 * (a stale socket a crashed patd left).
 */
#include "pat_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "pat_base.h"

/* pat.h's admin operations are the wire's opcodes: one value each, checked here */
#define PAT__SAME_OP(x) ((int)PAT_ADMIN_##x == (int)IPC_OP_##x)
_Static_assert(PAT__SAME_OP(STATUS) && PAT__SAME_OP(STATS) && PAT__SAME_OP(SEQS) &&
                   PAT__SAME_OP(DRAIN) && PAT__SAME_OP(RELOAD) && PAT__SAME_OP(CHECK) &&
                   PAT__SAME_OP(UPGRADE),
               "pat_admin_op_t follows ipc_proto.h's opcodes");
#undef PAT__SAME_OP

/* Reads exactly n bytes from a stream socket before the deadline: 0, -ETIMEDOUT, -ECONNRESET
 * (end of file), or read's errno. */
static int read_full(int fd, void *buf, size_t n, uint64_t deadline_ns)
{
    size_t got = 0;
    while (got < n) {
        uint64_t now = pat_now_ns();
        if (now >= deadline_ns)
            return -ETIMEDOUT;
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, (int)((deadline_ns - now) / 1000000ull) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r == 0 ? -ETIMEDOUT : -errno;
        ssize_t k = read(fd, (uint8_t *)buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -ECONNRESET;
        got += (size_t)k;
    }
    return 0;
}

/* The admin socket beside a control socket: <dir>/<name>.sock -> <dir>/<name>.admin. */
static void admin_path(const char *control, char *out, size_t len)
{
    size_t n = strlen(control);
    if (n > 5 && !strcmp(control + n - 5, ".sock"))
        snprintf(out, len, "%.*s.admin", (int)(n - 5), control);
    else
        snprintf(out, len, "%s.admin", control);
}

/* A connected stream socket to the admin socket beside a control socket (its path into sa):
 * the fd, or a negative errno (connect's). */
static int admin_connect(const char *control, struct sockaddr_un *sa)
{
    *sa = (struct sockaddr_un){.sun_family = AF_UNIX};
    admin_path(control, sa->sun_path, sizeof(sa->sun_path));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)sa, sizeof(*sa)) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

/* One HELLO on the admin socket: the daemon opens the session bound to this process as the
 * kernel names it (SO_PEERCRED; the HELLO's pid is only a claim) and passes the session's buffers
 * by fd (SCM_RIGHTS) beside the reply: a cpu session's staging memfd, or a GPU session's own
 * signal slice and staging allocation. 0 with c->hello and ret_fds (-1: none
 * came), or a negative errno with its cause in c->err: the daemon's error and detail, the
 * socket's own errno, -ECONNRESET where the daemon closed the connection before a reply, -EBADMSG
 * only for a reply that is not a HELLO reply. */
static int hello_once(pat_conn_t *c, const char *control, const ipc_hello_req_t *r,
                      uint64_t deadline, int ret_fds[2])
{
    ret_fds[0] = ret_fds[1] = -1;
    c->err[0] = 0;
    struct sockaddr_un sa;
    int fd = admin_connect(control, &sa);
    if (fd < 0) {
        pat__set_err(c, "admin socket %s: %s", sa.sun_path, strerror(-fd));
        return fd;
    }
    const uint64_t corr = pat_now_ns();
    ipc_buf_t b;
    ipc_buf_init(&b);
    ipc_frame_start(&b, IPC_OP_HELLO, 0, corr, 0);
    ipc_frame_put(&b, r, sizeof(*r));
    ipc_frame_finish(&b);
    ssize_t sent = send(fd, b.data, b.len, MSG_NOSIGNAL);
    int rc = sent == (ssize_t)b.len ? 0 : sent < 0 ? -errno : -ECONNRESET;
    ipc_buf_done(&b);
    if (rc < 0)
        pat__set_err(c, "sending the HELLO on %s: %s", sa.sun_path, strerror(-rc));
    /* the header with the fds beside it (the daemon sends the reply and its fds in one message:
     * one for a cpu session, two for a GPU session) */
    _Static_assert(sizeof(ipc_hello_rep_t) >= sizeof(ipc_err_body_t), "the larger body");
    uint8_t msg[sizeof(ipc_hdr_t) + sizeof(ipc_hello_rep_t)];
    ipc_hdr_t h;
    int got[2] = {-1, -1}, n_got = 0;
    while (rc == 0) {
        uint64_t now = pat_now_ns();
        struct pollfd p = {fd, POLLIN, 0};
        int pr = now >= deadline ? 0 : poll(&p, 1, (int)((deadline - now) / 1000000ull) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0) {
            rc = pr == 0 ? -ETIMEDOUT : -errno;
            pat__set_err(c, "no HELLO reply on %s: %s", sa.sun_path, strerror(-rc));
            break;
        }
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(2 * sizeof(int))];
        } ctl;
        struct iovec iov = {msg, sizeof(h)};
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = ctl.buf,
                           .msg_controllen = sizeof(ctl.buf)};
        ssize_t k = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
        if (k < 0 && errno == EINTR)
            continue;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); k > 0 && cm; cm = CMSG_NXTHDR(&m, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && n_got == 0 &&
                (cm->cmsg_len == CMSG_LEN(sizeof(int)) ||
                 cm->cmsg_len == CMSG_LEN(2 * sizeof(int)))) {
                n_got = cm->cmsg_len == CMSG_LEN(sizeof(int)) ? 1 : 2;
                memcpy(got, CMSG_DATA(cm), n_got * sizeof(int));
            }
        if (k < 0) {
            rc = -errno;
            pat__set_err(c, "reading the HELLO reply on %s: %s", sa.sun_path, strerror(-rc));
        } else if (k == 0) {
            rc = -ECONNRESET;
            pat__set_err(c, "patd closed the connection on %s before its HELLO reply", sa.sun_path);
        } else if (k != (ssize_t)sizeof(h) || (m.msg_flags & MSG_CTRUNC)) {
            rc = -EBADMSG;
        }
        break;
    }
    if (rc == 0) {
        memcpy(&h, msg, sizeof(h));
        if (h.corr != corr || h.body_len > sizeof(msg) - sizeof(h))
            rc = -EBADMSG;
        else if (h.body_len && (rc = read_full(fd, msg + sizeof(h), h.body_len, deadline)) < 0)
            pat__set_err(c, "reading the HELLO reply on %s: %s", sa.sun_path, strerror(-rc));
    }
    if (rc == 0 && (rc = ipc_frame_check(msg, sizeof(h) + h.body_len, 1, &h)) == -EPROTONOSUPPORT)
        pat__set_err(c,
                     "the daemon speaks wire protocol %u, this libpat %u: use a libpat of the "
                     "daemon's release",
                     (unsigned)h.version, (unsigned)IPC_VERSION);
    else if (rc < 0 && !c->err[0])
        rc = -EBADMSG; /* the frame's own check: not a reply this libpat reads */
    const void *body = NULL;
    size_t blen = 0;
    if (rc == 0)
        rc = pat__parse_reply(c, msg, sizeof(h) + h.body_len, &body, &blen);
    if (rc == 0 && (h.opcode != IPC_OP_HELLO || blen != sizeof(c->hello)))
        rc = -EBADMSG;
    close(fd);
    if (rc < 0) {
        for (int i = 0; i < n_got; i++)
            close(got[i]);
        if (rc == -EBADMSG && !c->err[0])
            pat__set_err(c, "malformed HELLO reply on the admin socket");
        return rc;
    }
    memcpy(&c->hello, body, sizeof(c->hello));
    ret_fds[0] = got[0];
    ret_fds[1] = got[1];
    return 0;
}

/* A HELLO that never reached the daemon's answer: it closed or reset the connection, or said
 * its admin socket was busy (-EBUSY: too many connections waiting). Tried again. */
static int hello_retryable(int rc)
{
    return rc == -ECONNRESET || rc == -EPIPE || rc == -ECONNABORTED || rc == -EBUSY;
}

/* Backoff between HELLO tries (ms): doubling from the first to the last, each a random point in
 * its upper half, so that a burst of frontends that were turned away together spreads out. */
#define HELLO_BACKOFF_FIRST_MS 2u
#define HELLO_BACKOFF_LAST_MS  256u

/* HELLO until answered or c->timeout_ms from now: hello_once, tried again with backoff while
 * hello_retryable (the error of the last try, with how many there were, is the result). */
int pat__hello(pat_conn_t *c, const char *control, const ipc_hello_req_t *r, int ret_fds[2])
{
    const uint64_t t0 = pat_now_ns(), deadline = t0 + (uint64_t)c->timeout_ms * 1000000ull;
    uint64_t x = t0 ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)c; /* xorshift state */
    uint32_t tries = 0, backoff = HELLO_BACKOFF_FIRST_MS;
    int rc;
    for (;;) {
        tries++;
        rc = hello_once(c, control, r, deadline, ret_fds);
        if (!hello_retryable(rc))
            break;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const uint64_t wait_ns = (backoff / 2 + x % (backoff / 2 + 1)) * 1000000ull;
        if (pat_now_ns() + wait_ns >= deadline)
            break;
        struct timespec ts = {0, (long)wait_ns};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
        backoff = PAT_MIN(backoff * 2, HELLO_BACKOFF_LAST_MS);
    }
    if (rc < 0 && tries > 1) {
        char last[sizeof(c->err)];
        snprintf(last, sizeof(last), "%s", c->err);
        pat__set_err(c, "%s (%u tries in %.2f s)", last, tries, (pat_now_ns() - t0) / 1e9);
    }
    return rc;
}

/* Where no daemon answers: the detail of -ENOENT and -ECONNREFUSED (the path tried) into c;
 * returns rc, other codes untouched. */
static int no_daemon(pat_conn_t *c, const char *path, int rc)
{
    static const struct {
        int code;
        const char *what;
    } rows[] = {{-ENOENT, "no socket at"}, {-ECONNREFUSED, "nothing listens at"}};
    for (size_t i = 0; i < PAT_ARRAY_SIZE(rows); i++)
        if (rows[i].code == rc)
            pat__set_err(c, "%s %s", rows[i].what, path);
    return rc;
}

/* One request frame (b, correlation id corr) on the admin socket, where the daemon knows who
 * asks (SO_PEERCRED): the reply frame, malloc'd; -ENOENT / -ECONNREFUSED (no daemon: their
 * detail into tmp->err) or another negative errno. */
static int admin_exchange(pat_conn_t *tmp, const char *control, const ipc_buf_t *b, uint64_t corr,
                          uint32_t timeout_ms, void **ret_msg, size_t *ret_len)
{
    struct sockaddr_un sa;
    int fd = admin_connect(control, &sa);
    if (fd < 0)
        return no_daemon(tmp, sa.sun_path, fd);
    const uint64_t deadline = pat_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int rc = send(fd, b->data, b->len, MSG_NOSIGNAL) == (ssize_t)b->len ? 0 : -ECONNRESET;
    ipc_hdr_t h;
    uint8_t *msg = NULL;
    if (rc == 0)
        rc = read_full(fd, &h, sizeof(h), deadline);
    if (rc == 0 && (h.body_len > (1u << 24) || h.corr != corr))
        rc = -EBADMSG;
    if (rc == 0) {
        msg = pat_xmalloc(sizeof(h) + h.body_len);
        memcpy(msg, &h, sizeof(h));
        rc = read_full(fd, msg + sizeof(h), h.body_len, deadline);
    }
    if (rc == 0 && (rc = ipc_frame_check(msg, sizeof(h) + h.body_len, 1, &h)) < 0 &&
        rc != -EPROTONOSUPPORT)
        rc = -EBADMSG; /* another version's daemon: its own error */
    close(fd);
    if (rc < 0) {
        free(msg);
        return rc;
    }
    *ret_msg = msg;
    *ret_len = sizeof(h) + h.body_len;
    return 0;
}

/* One admin request on the admin socket: the read-only ones are served there to anyone the
 * socket's mode lets in, the others to patd's user, root and daemon.admin_group. 0 and the reply
 * (a malloc'd copy; free it) with its body, or a negative errno (the daemon's detail, or the
 * socket no daemon answers at, into tmp->err): -ENOENT and -ECONNREFUSED (a stale socket) come
 * at once. */
static int admin_call(const char *socket, uint32_t op, uint32_t timeout_ms, pat_conn_t *tmp,
                      void **ret_msg, const void **ret_body, size_t *ret_len)
{
    const char *path = socket ? socket : pat_default_socket();
    timeout_ms = timeout_ms ? timeout_ms : 10000;
    void *msg = NULL;
    size_t n = 0;
    int rc;
    ipc_buf_t b;
    ipc_buf_init(&b);
    uint64_t corr = (uint64_t)getpid() << 32 | (uint32_t)pat_now_ns();
    ipc_frame_start(&b, op, 0, corr, 0);
    ipc_frame_finish(&b);
    rc = admin_exchange(tmp, path, &b, corr, timeout_ms, &msg, &n);
    ipc_buf_done(&b);
    if (rc < 0)
        return rc;
    if ((rc = pat__parse_reply(tmp, msg, n, ret_body, ret_len)) < 0) {
        free(msg);
        return rc;
    }
    *ret_msg = msg;
    return 0;
}

int pat_admin(const char *socket, pat_admin_op_t op, uint32_t timeout_ms, char **ret_text)
{
    if (ipc_op_is_admin((uint32_t)op) != 1 || op == (pat_admin_op_t)IPC_OP_HELLO ||
        op == (pat_admin_op_t)IPC_OP_INFO || !ret_text)
        return -EINVAL;
    pat_conn_t tmp = {0};
    void *msg = NULL;
    const void *body = NULL;
    size_t len = 0;
    int rc = admin_call(socket, (uint32_t)op, timeout_ms, &tmp, &msg, &body, &len);
    if (rc == 0) {
        char *t = pat_xmalloc(len + 1);
        memcpy(t, body, len);
        t[len] = 0;
        *ret_text = t;
        free(msg);
    } else if (tmp.err[0]) {
        char *t = pat_xmalloc(sizeof(tmp.err));
        snprintf(t, sizeof(tmp.err), "%s", tmp.err);
        *ret_text = t;
    }
    return rc;
}

int pat_status(const char *socket, uint32_t timeout_ms, pat_status_t *ret)
{
    if (!ret || ret->size < offsetof(pat_status_t, reserved))
        return -EINVAL;
    pat_conn_t tmp = {0};
    void *msg = NULL;
    const void *body = NULL;
    size_t len = 0;
    int rc = admin_call(socket, IPC_OP_INFO, timeout_ms, &tmp, &msg, &body, &len);
    if (rc < 0)
        return rc;
    /* fields are only ever appended: take what both sides know, zero the rest */
    ipc_info_rep_t r;
    memset(&r, 0, sizeof(r));
    uint32_t size = 0;
    if (len >= sizeof(size))
        memcpy(&size, body, sizeof(size));
    if (len < offsetof(ipc_info_rep_t, reserved1) || size != len) {
        free(msg);
        return -EBADMSG;
    }
    memcpy(&r, body, PAT_MIN(len, sizeof(r)));
    free(msg);
    uint32_t want = ret->size;
    pat_status_t st;
    memset(&st, 0, sizeof(st));
    st.size = (uint32_t)PAT_MIN((size_t)want, sizeof(st));
    st.protocol = r.protocol;
    st.version = r.version;
    st.pid = r.pid;
    st.instance = r.instance;
    st.uptime_ms = r.uptime_ms;
    st.draining = r.state == IPC_STATE_DRAINING;
    st.max_seq_len = r.max_seq_len;
    memcpy(st.backend, r.backend, sizeof(st.backend));
    st.backend[sizeof(st.backend) - 1] = 0;
    st.model =
        (pat_model_t){r.model.n_layers, r.model.q_heads,    r.model.kv_heads, r.model.head_dim,
                      r.model.dtype,    r.model.block_size, r.model.model_id};
    st.max_conns = r.max_conns;
    st.conn_max_seqs = r.conn_max_seqs;
    st.conn_max_blocks = r.conn_max_blocks;
    st.conn_max_batch_tokens = r.conn_max_batch_tokens;
    st.conn_max_staging_mb = r.conn_max_staging_mb;
    st.lease_ms = r.lease_ms;
    st.step_timeout_ms = r.step_timeout_ms;
    st.blocks_total = r.blocks_total;
    st.blocks_free = r.blocks_free;
    st.blocks_used = r.blocks_used;
    st.blocks_cached = r.blocks_cached;
    st.sequences = r.sequences;
    st.connections = r.connections;
    st.steps_in_flight = r.steps_in_flight;
    st.scale = r.scale; /* 0 where an older daemon's reply ended before it */
    st.softcap = r.softcap;
    st.kv_dtype = r.kv_dtype;
    st.kv_scale = r.kv_scale;
    memcpy(ret, &st, st.size);
    return 0;
}
