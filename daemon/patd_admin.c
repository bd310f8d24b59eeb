/*
 * patd_admin.c — the admin socket, <runtime_dir>/<name>.admin: a Unix stream socket served by
 * libuv on the loop thread, where the kernel tells who is asking (SO_PEERCRED).
 *
 * Operations that change the daemon's state (DRAIN, RELOAD, CHECK, UPGRADE; CHECK holds the pool
 * lock for O(blocks)) are served here only, and only to the daemon's own user, root, or members
 * of daemon.admin_group; read-only ones (STATUS, STATS, SEQS, INFO) are served here too, to
 * anyone the socket's mode lets connect. One request per connection: a 40-byte frame header
 * (admin bodies are empty), one reply frame, close.
 *
 * HELLO is served here only: the request is the header and an ipc_hello_req_t, the reply the
 * header and an ipc_hello_rep_t with the session's buffer fd beside it (SCM_RIGHTS: a
 * cpu session's staging buffer, a sealed memfd with no name another process could open; a GPU
 * session's own signal slice and staging allocation). The session is bound at once to the process
 * the kernel names (its pid is watched, whatever pid the HELLO claims) and counted against its
 * uid's limits.conns_per_uid: every session has an owner the kernel vouches for from its first
 * moment, so HELLOs no one can attribute cannot fill the table. Bounded: at most
 * PATD_ADMIN_MAX_CONNS connections served at once and PATD_ADMIN_PER_UID from one user (the
 * kernel's word), each closed after ADMIN_IDLE_MS: one user's idle connections cannot keep
 * another's HELLO out. A request answered later (RELOAD: its file is read off the loop) keeps its
 * connection until answered or until ADMIN_IDLE_MS, when the answer says it did not come in time
 * (patd_admin_defer).
 *
 * Connections past those bounds are not closed: frontends of one user that start together (a
 * daemon restart's reconnect storm) would lose their HELLOs. They wait, accepted and unread, in
 * arrival order, and each is served as a slot its user may take frees (a HELLO is served within
 * one loop turn of its request arriving, so a burst of 64 is served in a few hundred ms). The
 * wait is bounded too (patd_int.h): PATD_ADMIN_MAX_WAITING connections, PATD_ADMIN_WAIT_PER_UID
 * of one user, PATD_ADMIN_WAIT_MS each; past those a connection's request, if it came, gets an
 * -EBUSY error frame that says which bound (libpat tries a HELLO again, backing off), and the
 * refusal is logged (at most a line a second).
 *
 * Thread context: the loop thread.
 */
#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat_base.h"

#define ADMIN_IDLE_MS 5000u

typedef struct patd_admin_conn {
    uv_pipe_t pipe;
    uv_timer_t timer; /* served: ADMIN_IDLE_MS; waiting: PATD_ADMIN_WAIT_MS */
    patd_t *d;
    uint8_t buf[sizeof(ipc_hdr_t) + sizeof(ipc_hello_req_t)];
    size_t len, want; /* bytes read, bytes the request has (the header's, then its body's) */
    struct ucred cred;
    patd_req_t *owed;             /* a request answered later (patd_admin_defer), NULL: none */
    int slot;                     /* in d->admin_uid, -1: none (waiting, or refused) */
    int waiting;                  /* in d->admin_wait */
    struct patd_admin_conn *next; /* the next one waiting */
    int closing, handles;         /* handles still open (pipe, timer) */
} patd_admin_conn_t;

static void serve(patd_admin_conn_t *ac, int slot);
static void conn_close(patd_admin_conn_t *ac);

/* Served connections uid holds, and a free slot (-1: none). */
static uint32_t uid_served(const patd_t *d, uid_t uid, int *ret_free)
{
    uint32_t same = 0;
    *ret_free = -1;
    for (uint32_t i = 0; i < PATD_ADMIN_MAX_CONNS; i++) {
        if (!d->admin_used[i])
            *ret_free = *ret_free < 0 ? (int)i : *ret_free;
        else
            same += d->admin_uid[i] == uid;
    }
    return same;
}

static void wait_remove(patd_admin_conn_t *ac)
{
    patd_t *d = ac->d;
    patd_admin_conn_t **p = &d->admin_wait, *prev = NULL;
    while (*p && *p != ac)
        p = &(prev = *p)->next;
    assert(*p == ac);
    *p = ac->next;
    if (d->admin_wait_tail == ac)
        d->admin_wait_tail = prev;
    ac->next = NULL;
    ac->waiting = 0;
    d->n_admin_wait--;
}

/* Whether the peer has closed its end (a client that gave up waiting): nothing to serve. */
static int peer_gone(patd_admin_conn_t *ac)
{
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&ac->pipe, &fd) < 0)
        return 1;
    struct pollfd p = {fd, 0, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & POLLHUP);
}

/* Serves the oldest waiting connections whose users may take a slot, while slots are free;
 * those whose clients gave up meanwhile are closed unserved. */
static void serve_waiting(patd_t *d)
{
    for (patd_admin_conn_t *ac = d->admin_wait, *next; ac; ac = next) {
        next = ac->next;
        int slot;
        if (uid_served(d, ac->cred.uid, &slot) >= PATD_ADMIN_PER_UID)
            continue;
        if (slot < 0)
            return;
        wait_remove(ac);
        if (peer_gone(ac))
            conn_close(ac); /* takes no slot */
        else
            serve(ac, slot);
    }
}

static void conn_freed(uv_handle_t *h)
{
    patd_admin_conn_t *ac = h->data;
    if (--ac->handles == 0) {
        patd_t *d = ac->d;
        d->n_admin--;
        if (ac->slot >= 0)
            d->admin_used[ac->slot] = 0;
        free(ac);
        serve_waiting(d);
    }
}

static void conn_close(patd_admin_conn_t *ac)
{
    if (ac->closing)
        return;
    ac->closing = 1;
    if (ac->owed) /* its answer, when it comes, goes nowhere */
        ac->owed->reply_fn = NULL;
    ac->owed = NULL;
    if (ac->waiting)
        wait_remove(ac);
    uv_close((uv_handle_t *)&ac->timer, conn_freed);
    uv_close((uv_handle_t *)&ac->pipe, conn_freed);
}

static void on_written(uv_write_t *w, int status)
{
    patd_admin_conn_t *ac = w->data;
    free(w);
    conn_close(ac);
}

static void admin_send(void *ud, const void *frame, size_t len)
{
    patd_admin_conn_t *ac = ud;
    ac->owed = NULL; /* this is the answer (patd_send clears its reply_fn) */
    if (ac->closing)
        return;
    uv_write_t *w = pat_xmalloc(sizeof(*w) + len);
    memcpy(w + 1, frame, len);
    uv_buf_t b = uv_buf_init((char *)(w + 1), (unsigned)len);
    w->data = ac;
    if (uv_write(w, (uv_stream_t *)&ac->pipe, &b, 1, on_written) < 0) {
        free(w);
        conn_close(ac);
    }
}

/* Whether the peer may change the daemon's state: its user, root, or a member of admin_group
 * (its primary group, or a supplementary one as /proc/<pid>/status lists them). */
int patd_may_administer(const patd_t *d, const struct ucred *cr)
{
    if (cr->uid == 0 || cr->uid == geteuid())
        return 1;
    if (d->admin_gid == (gid_t)-1)
        return 0;
    if (cr->gid == d->admin_gid)
        return 1;
    char path[64], line[4096];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)cr->pid);
    FILE *f = fopen(path, "r");
    int ok = 0;
    while (f && !ok && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "Groups:", 7))
            continue;
        for (char *p = line + 7, *end; *p; p = end) {
            unsigned long g = strtoul(p, &end, 10);
            if (end == p)
                break;
            ok |= (gid_t)g == d->admin_gid;
        }
    }
    if (f)
        fclose(f);
    return ok;
}

/* HELLO: the session opened and bound to the peer, the reply with its buffers' fds beside it
 * (a GPU session's: its own signal slice and staging allocation, their fds closed once sent; a
 * cpu session's: its own staging buffer, dropped once sent). */
static void hello(patd_admin_conn_t *ac, patd_req_t *rq, const ipc_hdr_t *h, const void *body)
{
    patd_t *d = ac->d;
    int rc = ipc_body_check(IPC_OP_HELLO, body, h->body_len);
    if (rc < 0) {
        patd_reply_error(d, rq, rc, "HELLO body refused: %s", ipc_err_text(rc));
        return;
    }
    if (h->session != 0) {
        patd_reply_error(d, rq, -EINVAL, "HELLO carries session 0");
        return;
    }
    ipc_hello_req_t r;
    ipc_hello_rep_t rep;
    char why[IPC_ERRMSG_LEN] = "";
    memcpy(&r, body, sizeof(r));
    if ((rc = patd_conn_hello(d, &r, &ac->cred, &rep, why, sizeof(why))) < 0) {
        patd_reply_error(d, rq, rc, "%s", why);
        return;
    }
    patd_conn_t *c = patd_conn_find(d, rep.session);
    ipc_buf_t b;
    ipc_buf_init(&b);
    ipc_frame_start(&b, IPC_OP_HELLO, IPC_F_REPLY, h->corr, c->session);
    ipc_frame_put(&b, &rep, sizeof(rep));
    ipc_frame_finish(&b);
    const int sfd[2] = {c->gpu ? c->gsig_share.fd : ipc_shm_fd(&c->shm), c->gpu ? c->share.fd : -1};
    const int n_fds = sfd[0] < 0 ? 0 : sfd[1] < 0 ? 1 : 2;
    uv_os_fd_t fd;
    struct iovec iov = {b.data, b.len};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(2 * sizeof(int))];
    } ctl;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n_fds) {
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = CMSG_SPACE(n_fds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
        memcpy(CMSG_DATA(cm), sfd, n_fds * sizeof(int));
    }
    /* one small message into an empty socket buffer: it does not block */
    ssize_t n = uv_fileno((uv_handle_t *)&ac->pipe, &fd) < 0
                    ? -1
                    : sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n != (ssize_t)b.len) {
        patd_warn("session %016llx: HELLO reply not sent (%s); closed",
                  (unsigned long long)c->session, n < 0 ? strerror(errno) : "short write");
        patd_conn_close(c, "HELLO reply not delivered");
    } else if (!c->gpu) {
        ipc_shm_drop_fd(&c->shm); /* the client has it; the daemon keeps its mapping */
    } else {
        close(c->share.fd); /* likewise: the client imports them, the daemon keeps its mappings */
        c->share.fd = -1;
        close(c->gsig_share.fd);
        c->gsig_share.fd = -1;
    }
    ipc_buf_done(&b);
    conn_close(ac);
}

static void alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    patd_admin_conn_t *ac = h->data;
    *buf = uv_buf_init((char *)ac->buf + ac->len, (unsigned)(ac->want - ac->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    patd_admin_conn_t *ac = s->data;
    if (n < 0) {
        conn_close(ac);
        return;
    }
    ac->len += (size_t)n;
    if (ac->len == sizeof(ipc_hdr_t) && ac->want == sizeof(ipc_hdr_t)) {
        /* a HELLO's body follows its header; every other admin request is a header alone */
        ipc_hdr_t h;
        memcpy(&h, ac->buf, sizeof(h));
        if (h.magic == IPC_MAGIC && h.opcode == IPC_OP_HELLO &&
            h.body_len == sizeof(ipc_hello_req_t))
            ac->want = sizeof(ac->buf);
    }
    if (ac->len < ac->want)
        return;
    uv_read_stop(s);
    patd_t *d = ac->d;
    patd_req_t rq = {.reply_fn = admin_send, .reply_ud = ac};
    ipc_hdr_t h;
    memcpy(&rq.hdr, ac->buf, sizeof(rq.hdr));
    int rc = ipc_frame_check(ac->buf, ac->len, 0, &h); /* a body not read: -EMSGSIZE */
    if (rc < 0) {
        rq.hdr.flags = 0;
        patd_reply_error(d, &rq, rc, "admin frame refused: %s", ipc_err_text(rc));
        return;
    }
    if (h.opcode < IPC_OP_MAX)
        atomic_fetch_add(&d->m.frames[h.opcode], 1);
    if (h.opcode == IPC_OP_HELLO) {
        hello(ac, &rq, &h, ac->buf + sizeof(h));
        return;
    }
    if (h.opcode == IPC_OP_ATTACH) {
        patd_reply_error(d, &rq, -EOPNOTSUPP,
                         "ATTACH is retired (protocol 5): HELLO on this socket binds the session");
        return;
    }
    if (ipc_op_is_admin(h.opcode) != 1) {
        patd_reply_error(d, &rq, -EOPNOTSUPP, "%s is not an admin request", ipc_op_name(h.opcode));
        return;
    }
    if (ipc_op_changes_state(h.opcode) && !patd_may_administer(d, &ac->cred)) {
        patd_notice("admin: %s refused to uid %u gid %u pid %d", ipc_op_name(h.opcode),
                    (unsigned)ac->cred.uid, (unsigned)ac->cred.gid, (int)ac->cred.pid);
        patd_reply_error(d, &rq, -EPERM,
                         "%s changes the daemon: it is for patd's user, root or daemon.admin_group",
                         ipc_op_name(h.opcode));
        return;
    }
    d->admin_dispatch(d, &rq, &h);
}

void patd_admin_defer(patd_req_t *rq, patd_req_t *slot)
{
    assert(rq->reply_fn == admin_send);
    patd_admin_conn_t *ac = rq->reply_ud;
    *slot = *rq;
    rq->reply_fn = NULL;
    ac->owed = slot;
}

/* ADMIN_IDLE_MS after connecting: an owed answer says it did not come in time (the daemon goes
 * on with the request: a reload still reading its file applies when it has); otherwise close. */
static void on_idle(uv_timer_t *t)
{
    patd_admin_conn_t *ac = t->data;
    if (ac->owed)
        patd_reply_error(ac->d, ac->owed, -ETIMEDOUT,
                         "%s: no answer within %u ms; the daemon goes on with it (see its log)",
                         ipc_op_name(ac->owed->hdr.opcode), ADMIN_IDLE_MS);
    else
        conn_close(ac);
}

/* A connection that cannot be served: its request, if it has come, gets an -EBUSY error frame
 * naming the bound (the frame goes out, then the connection closes); otherwise it is closed. */
static void refuse_busy(patd_admin_conn_t *ac, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void refuse_busy(patd_admin_conn_t *ac, const char *fmt, ...)
{
    patd_t *d = ac->d;
    char why[IPC_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    patd_refused(d, PATD_REFUSED_ADMIN_BUSY, "uid %u pid %d: %s", (unsigned)ac->cred.uid,
                 (int)ac->cred.pid, why);
    uv_os_fd_t fd;
    ssize_t n = -1;
    if (uv_fileno((uv_handle_t *)&ac->pipe, &fd) == 0) /* what it sent, all of it: unread bytes
                                                          left at close would reset the reply */
        n = recv(fd, ac->buf, sizeof(ac->buf), MSG_DONTWAIT);
    patd_req_t rq = {.reply_fn = admin_send, .reply_ud = ac};
    if (n < (ssize_t)sizeof(ipc_hdr_t)) {
        conn_close(ac);
        return;
    }
    memcpy(&rq.hdr, ac->buf, sizeof(rq.hdr));
    if (rq.hdr.magic != IPC_MAGIC) {
        conn_close(ac);
        return;
    }
    rq.hdr.flags = 0;
    patd_reply_error(d, &rq, -EBUSY, "admin socket busy: %s; try again", why);
}

static void on_wait_over(uv_timer_t *t)
{
    patd_admin_conn_t *ac = t->data;
    wait_remove(ac);
    refuse_busy(ac, "waited %u ms for one of the %u connections served at once (%u per user)",
                PATD_ADMIN_WAIT_MS, PATD_ADMIN_MAX_CONNS, PATD_ADMIN_PER_UID);
}

/* A slot: the connection's request is read and answered (or it idles out). */
static void serve(patd_admin_conn_t *ac, int slot)
{
    patd_t *d = ac->d;
    ac->slot = slot;
    d->admin_used[slot] = 1;
    d->admin_uid[slot] = ac->cred.uid;
    uv_timer_start(&ac->timer, on_idle, ADMIN_IDLE_MS, 0);
    uv_read_start((uv_stream_t *)&ac->pipe, alloc_cb, on_read);
}

static void on_connection(uv_stream_t *server, int status)
{
    patd_t *d = server->data;
    if (status < 0)
        return;
    patd_admin_conn_t *ac = pat_xcalloc(1, sizeof(*ac));
    ac->d = d;
    ac->slot = -1;
    ac->want = sizeof(ipc_hdr_t);
    uv_pipe_init(&d->loop, &ac->pipe, 0);
    uv_timer_init(&d->loop, &ac->timer);
    ac->pipe.data = ac->timer.data = ac;
    ac->handles = 2;
    d->n_admin++;
    if (uv_accept(server, (uv_stream_t *)&ac->pipe) < 0) {
        conn_close(ac);
        return;
    }
    uv_os_fd_t fd;
    socklen_t sl = sizeof(ac->cred);
    if (uv_fileno((uv_handle_t *)&ac->pipe, &fd) < 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &ac->cred, &sl) < 0) {
        conn_close(ac);
        return;
    }
    int slot;
    const uint32_t same = uid_served(d, ac->cred.uid, &slot);
    uint32_t same_waiting = 0;
    for (const patd_admin_conn_t *w = d->admin_wait; w; w = w->next)
        same_waiting += w->cred.uid == ac->cred.uid;
    /* served at once where a slot is free for its user and no one of its user is ahead */
    const int now = slot >= 0 && same < PATD_ADMIN_PER_UID && same_waiting == 0;
    if (!now &&
        (d->n_admin_wait >= PATD_ADMIN_MAX_WAITING || same_waiting >= PATD_ADMIN_WAIT_PER_UID)) {
        refuse_busy(ac, "%u connections wait (%u at most), %u of them uid %u's (%u at most)",
                    d->n_admin_wait, PATD_ADMIN_MAX_WAITING, same_waiting, (unsigned)ac->cred.uid,
                    PATD_ADMIN_WAIT_PER_UID);
        return;
    }
    ac->waiting = 1;
    if (d->admin_wait_tail)
        d->admin_wait_tail->next = ac;
    else
        d->admin_wait = ac;
    d->admin_wait_tail = ac;
    d->n_admin_wait++;
    uv_timer_start(&ac->timer, on_wait_over, PATD_ADMIN_WAIT_MS, 0);
    serve_waiting(d); /* arrival order: this one now, if it is first of its user */
}

int patd_admin_start(patd_t *d)
{
    const patd_config_t *cfg = &d->cfg;
    snprintf(d->admin_path, sizeof(d->admin_path), "%.255s/%.63s.admin", cfg->runtime_dir,
             cfg->name);
    int rc = patd_group(cfg->admin_group, "admin_group", &d->admin_gid);
    if (rc < 0)
        return rc;
    unlink(d->admin_path); /* a stale one of ours: the runtime directory is ours alone */
    uv_pipe_init(&d->loop, &d->admin, 0);
    d->admin.data = d;
    mode_t old = umask(0077);
    rc = uv_pipe_bind(&d->admin, d->admin_path);
    umask(old);
    if (rc == 0)
        rc = patd_socket_own(d, d->admin_path);
    if (rc == 0) /* a burst's connects queue in the kernel until the loop accepts them */
        rc = uv_listen((uv_stream_t *)&d->admin, PATD_ADMIN_MAX_CONNS + PATD_ADMIN_MAX_WAITING,
                       on_connection);
    if (rc < 0) {
        patd_err("admin socket %s: %s", d->admin_path, uv_strerror(rc));
        uv_close((uv_handle_t *)&d->admin, NULL);
        return rc;
    }
    d->admin_on = 1;
    return 0;
}

void patd_admin_stop(patd_t *d)
{
    if (!d->admin_on)
        return;
    uv_close((uv_handle_t *)&d->admin, NULL);
    unlink(d->admin_path);
    d->admin_on = 0;
}
