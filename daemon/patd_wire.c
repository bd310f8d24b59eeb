/*
 * patd_wire.c — the control socket <runtime_dir>/<name>.sock and the event socket <name>.events:
 * Unix stream sockets of patd's own, served by libuv on the loop thread (the wire protocol of
 * ipc_proto.h, IPC_VERSION).
 *
 * Why not nanomsg: its ipc transport asserts on a peer's bytes (a 13-byte message from any member
 * of the socket group aborts the process: tests/integ/test_hostile.c sends it) and keeps the
 * descriptors peers attach (SCM_RIGHTS); it cannot say who sent a frame. Here the kernel says who
 * is at the other end of each connection (SO_PEERCRED at accept), libuv reads with read(2), so any
 * descriptor a peer attaches is closed by the kernel unread, and every byte is parsed by code of
 * ours that answers or closes.
 *
 * Control connections. A stream of frames (ipc_proto.h: a 40-byte header, then body_len bytes),
 * one request at a time: after a whole frame, reading stops until its reply is written, so a peer
 * that pipelines only fills its own socket buffer. A connection carries either read-only admin
 * requests (session 0, empty bodies) or one session's requests: the first frame naming a session
 * binds the connection to it, when the session's key matches and the kernel says the peer is the
 * process (pid and uid) that opened it by HELLO on the admin socket; another connection can never
 * act on it, and a session whose control connection closes is closed. A body is read into memory
 * that grows as its bytes arrive, only on a bound connection (an unbound one may send headers
 * only), up to what the largest valid request of the daemon's limits needs. Connections without
 * a session are bounded (WIRE_UNBOUND_MAX, WIRE_UNBOUND_PER_UID) and closed after
 * WIRE_UNBOUND_IDLE_MS. A reply is written once, to the connection and the request it answers (a
 * stale reply, to a connection since closed or a request since answered, is dropped); a request
 * whose session is reaped before its reply gets -ENOTCONN. A nanomsg client (protocol <= 7) is
 * recognised by its SP header and told so in the log.
 *
 * Event connections. patd writes event lines ("stored <block> <hash>", "evicted ...", "conn up
 * ...", "conn down ...") to each subscriber; a subscriber sends nothing (a byte closes it). A
 * subscriber sees the events of its own user's prefix scope (the kernel's uid at connect), of
 * the shared scope where pool.prefix_scope = all, and all of them if it may administer the daemon
 * (its user, root, daemon.admin_group): block hashes are computed from token ids anyone could
 * guess, so another user's stream would confirm their prompts. Bounded: WIRE_SUBS_MAX at once,
 * WIRE_SUBS_PER_UID per user; one that lets WIRE_SUB_QUEUE bytes queue up is closed. Events come
 * from any thread (the KV pool emits under pool_mu): they are queued in a ring under a mutex and
 * written by the loop thread.
 *
 * Refusals are logged at most once per second per cause, with the count of those not logged.
 * Thread context: the loop thread, except patd_wire_event (any thread).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "patd_int.h"
#include "patd_log.h"
#include "pat_base.h"

/* Control connections without a session, at once, and of one user (the kernel's uid): a frontend
 * connects, opens its session on the admin socket and binds the connection with its first
 * request, a few milliseconds; 64 frontends of one user starting together must all get in. */
#define WIRE_UNBOUND_MAX     512u
#define WIRE_UNBOUND_PER_UID 128u
#define WIRE_UNBOUND_IDLE_MS 5000u        /* an unbound connection is closed after this long */
#define WIRE_MAX_QUEUED      (8u << 20)   /* reply bytes queued to a peer that does not read */
#define WIRE_SUBS_MAX        64u          /* event subscribers at once */
#define WIRE_SUBS_PER_UID    8u           /* ... of one user */
#define WIRE_SUB_QUEUE       (256u << 10) /* bytes queued to a subscriber before it is closed */
#define WIRE_RING            4096u        /* event lines waiting for the loop thread */
#define WIRE_LINE            160u         /* bytes of one event line, newline included */
#define WIRE_BODY_CHUNK      (64u << 10)  /* a body's memory grows by at least this much */

typedef struct wire_conn {
    uv_pipe_t pipe;
    uv_timer_t timer;
    patd_t *d;
    uint64_t id; /* gen << 32 | slot + 1: what a request keeps to be answered here */
    struct ucred cred;
    int sub;            /* an event subscriber */
    uint8_t *buf;       /* the frame being read: header, then body */
    size_t cap, have;   /* bytes allocated, bytes read */
    size_t want;        /* bytes the frame has (the header's, then the whole frame's) */
    uint64_t session;   /* bound session id (0: none) */
    int owed;           /* a request was dispatched and its reply is not written yet */
    ipc_hdr_t owed_hdr; /* its header (an -ENOTCONN answer when its session goes) */
    int fd;
    uint64_t t_accept;     /* an unbound control connection: when it came (oldest_idle) */
    int close_after;       /* close once the queued writes are out */
    const char *close_why; /* ... and why, for its session's end */
    int closing, handles;
} wire_conn_t;

typedef struct wire_line {
    uint64_t scope; /* the prefix scope of what the event is about; 0: everyone's */
    uint16_t len;
    char text[WIRE_LINE];
} wire_line_t;

/* what is logged at most a line a second (patd_log_limited), each on its own */
enum {
    RL_UNBOUND,
    RL_SUBS,
    RL_BIND,
    RL_NANOMSG,
    RL_ACCEPT,
    RL_SLOW,
    RL_FRAME,
    RL_RING,
    RL_FDS,
    RL_N
};

struct patd_wire {
    patd_t *d;
    uv_pipe_t ctl, ev;
    int ctl_on, ev_on;
    wire_conn_t **slot; /* [n_slots] */
    uint32_t *gen;
    uint32_t n_slots;
    uint32_t n_unbound, n_subs;
    uint64_t max_body; /* the largest body a valid request of this daemon has */
    int fd_limit;      /* RLIMIT_NOFILE at start */
    int fd_reserve;    /* descriptors connections without a session may never take: HELLOs,
                          staging buffers, pidfds and metrics clients keep them */
    uv_async_t ev_async;
    int ev_async_on;
    uv_timer_t lost_timer; /* on_lost */
    pthread_mutex_t ev_mu;
    wire_line_t *ring; /* [WIRE_RING] */
    uint32_t ring_head, ring_len;
    uint64_t ev_dropped;
    patd_log_limit_t rl[RL_N]; /* refusals and troubles, each at most a line a second */
};

/* ------------------------------------------------------------------ rate-limited log */

#define rlog(w, cause, level, ...) patd_log_limited(&(w)->rl[cause], level, __VA_ARGS__)

/* ------------------------------------------------------------------ connections */
static wire_conn_t *conn_get(patd_wire_t *w, uint64_t id)
{
    uint32_t s = (uint32_t)id;
    if (s == 0 || s > w->n_slots || !w->slot[s - 1] || w->gen[s - 1] != (uint32_t)(id >> 32))
        return NULL;
    return w->slot[s - 1];
}

static void conn_freed(uv_handle_t *h)
{
    wire_conn_t *wc = h->data;
    if (--wc->handles)
        return;
    free(wc->buf);
    free(wc);
}

/* Sessions whose control connection closed PATD_WIRE_LOST_MS ago end (patd_conn_wire_lost);
 * the timer runs again for those that closed since. */
static void on_lost(uv_timer_t *t)
{
    patd_wire_t *w = t->data;
    patd_t *d = w->d;
    uint64_t now = pat_now_ns(), next = 0;
    for (uint32_t i = 0; i < d->n_conns; i++) {
        patd_conn_t *c = d->conns[i];
        if (!c->wire_lost_ns || c->closing)
            continue;
        uint64_t due = c->wire_lost_ns + PATD_WIRE_LOST_MS * 1000000ull;
        if (due <= now) {
            c->wire_lost_ns = 0;
            patd_conn_wire_lost(c);
            i = (uint32_t)-1; /* the table may have changed (reap swaps): rescan */
            continue;
        }
        next = next && next < due ? next : due;
    }
    if (next)
        uv_timer_start(&w->lost_timer, on_lost, (next - now) / 1000000ull + 1, 0);
}

static void conn_close(wire_conn_t *wc, const char *why)
{
    if (wc->closing)
        return;
    wc->closing = 1;
    patd_t *d = wc->d;
    patd_wire_t *w = d->wire;
    uint32_t s = (uint32_t)wc->id - 1;
    w->slot[s] = NULL;
    w->gen[s]++;
    if (wc->sub)
        w->n_subs--;
    else if (!wc->session)
        w->n_unbound--;
    if (wc->session) {
        patd_conn_t *c = patd_conn_find(d, wc->session);
        if (c && c->wire == wc->id) {
            c->wire = 0;
            if (why && !c->closing) /* the daemon ended it: a malformed frame */
                patd_conn_close(c, why);
            else if (!c->closing) { /* the client's end, or its exit: on_lost decides */
                c->wire_lost_ns = pat_now_ns();
                if (!uv_is_active((uv_handle_t *)&w->lost_timer))
                    uv_timer_start(&w->lost_timer, on_lost, PATD_WIRE_LOST_MS, 0);
            }
        }
    }
    uv_close((uv_handle_t *)&wc->timer, conn_freed);
    uv_close((uv_handle_t *)&wc->pipe, conn_freed);
}

static void on_written(uv_write_t *req, int status)
{
    wire_conn_t *wc = req->data;
    free(req);
    if (wc->closing)
        return;
    if (status < 0 ||
        (wc->close_after && uv_stream_get_write_queue_size((uv_stream_t *)&wc->pipe) == 0))
        conn_close(wc, wc->close_why);
}

/* Queues bytes to the peer (copied); 0, or -ENOBUFS when too much is queued already (closed). */
static int conn_write(wire_conn_t *wc, const void *data, size_t len, size_t max_queued)
{
    if (uv_stream_get_write_queue_size((uv_stream_t *)&wc->pipe) + len > max_queued)
        return -ENOBUFS;
    uv_write_t *req = pat_xmalloc(sizeof(*req) + len);
    memcpy(req + 1, data, len);
    uv_buf_t b = uv_buf_init((char *)(req + 1), (unsigned)len);
    req->data = wc;
    int rc = uv_write(req, (uv_stream_t *)&wc->pipe, &b, 1, on_written);
    if (rc < 0) {
        free(req);
        return rc;
    }
    return 0;
}

static void read_on(wire_conn_t *wc);
static void read_start(wire_conn_t *wc);

/* An error answer to the frame whose header is h, written here (not through a request). */
static void conn_refuse(wire_conn_t *wc, const ipc_hdr_t *h, int code, int then_close,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void conn_refuse(wire_conn_t *wc, const ipc_hdr_t *h, int code, int then_close,
                        const char *fmt, ...)
{
    char msg[IPC_ERRMSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ipc_hdr_t hh = *h;
    hh.flags = 0;
    ipc_buf_t b;
    ipc_buf_init(&b);
    ipc_frame_error(&b, &hh, code, "%s", msg);
    patd_metrics_error(wc->d, code);
    int rc = conn_write(wc, b.data, b.len, WIRE_MAX_QUEUED);
    ipc_buf_done(&b);
    if (rc < 0 || then_close) {
        wc->close_after = 1;
        wc->close_why = "a malformed frame on its control connection";
        if (rc < 0)
            conn_close(wc, NULL);
        else
            uv_read_stop((uv_stream_t *)&wc->pipe);
        return;
    }
    read_on(wc);
}

/* The next frame: reading starts over at its header (the frame just answered may still be in
 * use by its handler: its memory is given back when the next header is read). */
static void read_on(wire_conn_t *wc)
{
    wc->have = 0;
    wc->want = sizeof(ipc_hdr_t);
    if (!wc->closing && !wc->close_after)
        read_start(wc);
}

static void alloc_cb(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    wire_conn_t *wc = h->data;
    if (wc->sub) { /* a subscriber's bytes are only counted: a small sink */
        static char sink[64];
        *buf = uv_buf_init(sink, sizeof(sink));
        return;
    }
    if (wc->have == 0 && wc->cap > WIRE_BODY_CHUNK) { /* a big body's memory is not kept */
        free(wc->buf);
        wc->buf = pat_xmalloc(WIRE_BODY_CHUNK);
        wc->cap = WIRE_BODY_CHUNK;
    }
    size_t need = wc->want - wc->have;
    if (wc->have + need > wc->cap) { /* the body grows as its bytes arrive */
        size_t cap = PAT_MAX(wc->cap * 2, wc->have + PAT_MIN(need, (size_t)WIRE_BODY_CHUNK));
        cap = PAT_MIN(cap, wc->want);
        wc->buf = pat_xrealloc(wc->buf, cap);
        wc->cap = cap;
    }
    *buf = uv_buf_init((char *)wc->buf + wc->have, (unsigned)PAT_MIN(need, wc->cap - wc->have));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

static void read_start(wire_conn_t *wc)
{
    uv_read_start((uv_stream_t *)&wc->pipe, alloc_cb, on_read);
}

/* Binds wc to the session h names, where the kernel's word and the key allow. 0, or the error
 * the peer gets (the connection is closed after it). */
static int bind_session(wire_conn_t *wc, const ipc_hdr_t *h, char *why, size_t why_len)
{
    patd_t *d = wc->d;
    patd_conn_t *c = patd_conn_find(d, h->session);
    if (!c || c->closing || h->key != c->key) {
        snprintf(why, why_len, "session %016llx unknown%s", (unsigned long long)h->session,
                 (h->session >> 32) != (d->instance >> 32)
                     ? " (issued by another daemon instance: patd restarted)"
                     : " (closed or expired)");
        return -ENOTCONN;
    }
    if (wc->cred.uid != c->uid || wc->cred.pid != c->pid) {
        rlog(d->wire, RL_BIND, 5,
             "control: pid %d uid %u named session %016llx of pid %d uid %u; refused",
             (int)wc->cred.pid, (unsigned)wc->cred.uid, (unsigned long long)c->session, (int)c->pid,
             (unsigned)c->uid);
        snprintf(why, why_len, "session %016llx belongs to another process",
                 (unsigned long long)h->session);
        return -EPERM;
    }
    if (c->wire && conn_get(d->wire, c->wire)) {
        snprintf(why, why_len, "session %016llx has its control connection already",
                 (unsigned long long)h->session);
        return -EALREADY;
    }
    c->wire = wc->id;
    wc->session = c->session;
    d->wire->n_unbound--;
    uv_timer_stop(&wc->timer);
    return 0;
}

/* A whole header is in: what the frame may be, before any of its body is read. */
static void on_header(wire_conn_t *wc)
{
    patd_t *d = wc->d;
    ipc_hdr_t h;
    memcpy(&h, wc->buf, sizeof(h));
    static const uint8_t sp[4] = {0, 'S', 'P', 0};
    if (!memcmp(wc->buf, sp, sizeof(sp))) {
        rlog(d->wire, RL_NANOMSG, 4,
             "control: pid %d uid %u speaks nanomsg (a libpat of wire protocol 7 or older); "
             "this patd speaks %u: upgrade its libpat",
             (int)wc->cred.pid, (unsigned)wc->cred.uid, (unsigned)IPC_VERSION);
        conn_close(wc, NULL);
        return;
    }
    /* what the stream cannot be read past; everything else about a frame is handle_frame's */
    if (h.magic != IPC_MAGIC || h.version != IPC_VERSION ||
        h.body_len > IPC_MAX_FRAME - sizeof(h)) {
        int code = h.magic != IPC_MAGIC       ? -EBADMSG
                   : h.version != IPC_VERSION ? -EPROTONOSUPPORT
                                              : -EMSGSIZE;
        rlog(d->wire, RL_FRAME, 6, "control: frame from pid %d refused: %s", (int)wc->cred.pid,
             ipc_err_text(code));
        conn_refuse(wc, &h, code, 1, "frame refused: %s", ipc_err_text(code));
        return;
    }
    char why[IPC_ERRMSG_LEN];
    if (h.opcode == IPC_OP_HELLO) { /* opened where the kernel names the caller, with its fds */
        conn_refuse(wc, &h, -EPERM, 1, "HELLO is served on the admin socket %.120s only",
                    d->admin_path);
        return;
    }
    if (h.session == 0 && h.body_len) {
        /* admin requests have no body, and nothing is read for a peer without a session */
        conn_refuse(wc, &h, -EMSGSIZE, 1,
                    "a frame without a session carries no body (%u bytes announced)", h.body_len);
        return;
    }
    if (h.session != 0 && !wc->session) {
        int rc = bind_session(wc, &h, why, sizeof(why));
        if (rc < 0) {
            conn_refuse(wc, &h, rc, 1, "%s", why);
            return;
        }
    }
    if (h.body_len > d->wire->max_body) {
        conn_refuse(wc, &h, -E2BIG, 1, "a body of %u bytes; the largest request is %llu",
                    h.body_len, (unsigned long long)d->wire->max_body);
        return;
    }
    wc->want = sizeof(h) + h.body_len;
}

/* A whole frame is in: dispatched (the frame's own checks are handle_frame's, in patd_main.c);
 * reading resumes once its reply is written. */
static void on_frame(wire_conn_t *wc)
{
    uv_read_stop((uv_stream_t *)&wc->pipe);
    memcpy(&wc->owed_hdr, wc->buf, sizeof(ipc_hdr_t));
    if (wc->owed_hdr.session && wc->owed_hdr.session != wc->session) {
        conn_refuse(wc, &wc->owed_hdr, -EPERM, 0,
                    "this connection belongs to session %016llx, not %016llx",
                    (unsigned long long)wc->session, (unsigned long long)wc->owed_hdr.session);
        return;
    }
    wc->owed = 1;
    patd_req_t rq = {.wire = wc->id};
    wc->d->wire_dispatch(wc->d, wc->buf, wc->have, &rq);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    wire_conn_t *wc = s->data;
    if (n == 0)
        return;
    if (n < 0) {
        conn_close(wc, NULL); /* EOF, or a reset by a peer that died with bytes unread */
        return;
    }
    if (wc->sub) {
        conn_close(wc, NULL); /* subscribers only listen */
        return;
    }
    wc->have += (size_t)n;
    if (wc->have < wc->want)
        return;
    if (wc->want == sizeof(ipc_hdr_t)) {
        on_header(wc);
        if (wc->closing || wc->close_after || wc->have < wc->want)
            return;
    }
    if (wc->have == wc->want)
        on_frame(wc);
}

static void on_idle(uv_timer_t *t)
{
    wire_conn_t *wc = t->data;
    if (!wc->session && !wc->owed)
        conn_close(wc, NULL);
}

/* Whether a connection without a session that got descriptor fd leaves the reserve alone (fds
 * are handed out lowest first: fd is about how many are open); near the limit, said once a
 * second. */
static int fd_ok(patd_wire_t *w, int fd, const char *what)
{
    if (fd >= w->fd_limit - w->fd_reserve) {
        rlog(w, RL_FDS, 4,
             "%s: descriptor %d of the open-file limit %d: within the %d kept for sessions; "
             "connection closed",
             what, fd, w->fd_limit, w->fd_reserve);
        return 0;
    }
    if (fd >= w->fd_limit - 2 * w->fd_reserve)
        rlog(w, RL_FDS, 5, "%s: %d of the open-file limit %d descriptors in use", what, fd,
             w->fd_limit);
    return 1;
}

static wire_conn_t *conn_accept(patd_wire_t *w, uv_stream_t *server, int sub)
{
    patd_t *d = w->d;
    wire_conn_t *wc = pat_xcalloc(1, sizeof(*wc));
    wc->d = d;
    wc->sub = sub;
    uv_pipe_init(&d->loop, &wc->pipe, 0);
    uv_timer_init(&d->loop, &wc->timer);
    wc->pipe.data = wc->timer.data = wc;
    wc->handles = 2;
    uint32_t s = 0;
    while (s < w->n_slots && w->slot[s])
        s++;
    uv_os_fd_t fd;
    socklen_t sl = sizeof(wc->cred);
    if (uv_accept(server, (uv_stream_t *)&wc->pipe) < 0 ||
        uv_fileno((uv_handle_t *)&wc->pipe, &fd) < 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &wc->cred, &sl) < 0 || s == w->n_slots) {
        wc->closing = 1;
        uv_close((uv_handle_t *)&wc->timer, conn_freed);
        uv_close((uv_handle_t *)&wc->pipe, conn_freed);
        return NULL;
    }
    w->slot[s] = wc;
    wc->id = (uint64_t)w->gen[s] << 32 | (s + 1);
    wc->fd = (int)fd;
    return wc;
}

/* How many of w's connections of this kind one user holds now. */
static uint32_t held_by(const patd_wire_t *w, uid_t uid, int sub)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < w->n_slots; i++) {
        const wire_conn_t *o = w->slot[i];
        n += o && o->sub == sub && (sub || !o->session) && o->cred.uid == uid;
    }
    return n;
}

/* The unbound control connection, not waiting for an answer, accepted first (of user uid, or
 * of anyone with uid -1); NULL when none. */
static wire_conn_t *oldest_idle(const patd_wire_t *w, int64_t uid)
{
    wire_conn_t *best = NULL;
    for (uint32_t i = 0; i < w->n_slots; i++) {
        wire_conn_t *o = w->slot[i];
        if (!o || o->sub || o->session || o->owed || o->closing || o->close_after || !o->t_accept ||
            (uid >= 0 && o->cred.uid != (uid_t)uid))
            continue;
        if (!best || o->t_accept < best->t_accept)
            best = o;
    }
    return best;
}

static void on_ctl_connection(uv_stream_t *server, int status)
{
    patd_wire_t *w = server->data;
    if (status < 0) {
        rlog(w, RL_ACCEPT, 4, "control: accept: %s (open-file limit reached?)",
             uv_strerror(status));
        return;
    }
    wire_conn_t *wc = conn_accept(w, server, 0);
    if (!wc)
        return;
    if (!fd_ok(w, wc->fd, "control")) {
        w->n_unbound++; /* conn_close counts it out */
        conn_close(wc, NULL);
        return;
    }
    /* over a bound: the oldest idle connection without a session (of this user, or of anyone
     * when all together are too many) makes room, so that idle connections never keep a new
     * frontend out, whoever holds them */
    int mine = held_by(w, wc->cred.uid, 0) >= WIRE_UNBOUND_PER_UID;
    if (mine || w->n_unbound >= WIRE_UNBOUND_MAX) {
        wire_conn_t *old = oldest_idle(w, mine ? (int64_t)wc->cred.uid : -1);
        rlog(w, RL_UNBOUND, 5,
             "control: %u connections without a session (at most %u, %u per user): %s",
             w->n_unbound, WIRE_UNBOUND_MAX, WIRE_UNBOUND_PER_UID,
             old ? "the oldest idle one closed" : "the new one closed");
        if (!old) {
            w->n_unbound++; /* conn_close counts it out */
            conn_close(wc, NULL);
            return;
        }
        conn_close(old, NULL);
    }
    wc->t_accept = pat_now_ns();
    w->n_unbound++;
    wc->buf = pat_xmalloc(WIRE_BODY_CHUNK);
    wc->cap = WIRE_BODY_CHUNK;
    wc->want = sizeof(ipc_hdr_t);
    uv_timer_start(&wc->timer, on_idle, WIRE_UNBOUND_IDLE_MS, WIRE_UNBOUND_IDLE_MS);
    read_start(wc);
}

static void on_ev_connection(uv_stream_t *server, int status)
{
    patd_wire_t *w = server->data;
    if (status < 0) {
        rlog(w, RL_ACCEPT, 4, "events: accept: %s (open-file limit reached?)", uv_strerror(status));
        return;
    }
    wire_conn_t *wc = conn_accept(w, server, 1);
    if (!wc)
        return;
    w->n_subs++;
    if (!fd_ok(w, wc->fd, "events")) {
        conn_close(wc, NULL);
        return;
    }
    if (w->n_subs > WIRE_SUBS_MAX || held_by(w, wc->cred.uid, 1) > WIRE_SUBS_PER_UID) {
        rlog(w, RL_SUBS, 5,
             "events: subscriber pid %d uid %u closed: %u subscribers (at most %u, %u per user)",
             (int)wc->cred.pid, (unsigned)wc->cred.uid, w->n_subs - 1, WIRE_SUBS_MAX,
             WIRE_SUBS_PER_UID);
        conn_close(wc, NULL);
        return;
    }
    read_start(wc);
}

/* ------------------------------------------------------------------ replies */
void patd_wire_send(patd_t *d, uint64_t id, const void *frame, size_t len)
{
    wire_conn_t *wc = d->wire ? conn_get(d->wire, id) : NULL;
    if (!wc || wc->closing || !wc->owed || len < sizeof(ipc_hdr_t))
        return; /* the connection went, or its request was answered already */
    ipc_hdr_t h;
    memcpy(&h, frame, sizeof(h));
    if (h.corr != wc->owed_hdr.corr || h.opcode != wc->owed_hdr.opcode)
        return;
    wc->owed = 0;
    if (conn_write(wc, frame, len, WIRE_MAX_QUEUED) < 0) {
        rlog(d->wire, RL_SLOW, 5, "control: pid %d does not read its replies; closed",
             (int)wc->cred.pid);
        conn_close(wc, NULL);
        return;
    }
    read_on(wc);
}

void patd_wire_session_gone(patd_t *d, patd_conn_t *c, const char *reason)
{
    wire_conn_t *wc = c->wire && d->wire ? conn_get(d->wire, c->wire) : NULL;
    c->wire = 0;
    if (!wc)
        return;
    /* the connection was the session's: from now on one without a session (its idle timer
     * runs), where a request gets -ENOTCONN; one it still waits for gets it now */
    wc->session = 0;
    d->wire->n_unbound++;
    uv_timer_start(&wc->timer, on_idle, WIRE_UNBOUND_IDLE_MS, WIRE_UNBOUND_IDLE_MS);
    if (wc->owed) {
        wc->owed = 0;
        conn_refuse(wc, &wc->owed_hdr, -ENOTCONN, 0, "session %016llx closed (%s)",
                    (unsigned long long)c->session, reason ? reason : "reclaimed");
    }
}

/* ------------------------------------------------------------------ events */
void patd_wire_event(patd_t *d, uint64_t scope, const char *fmt, ...)
{
    patd_wire_t *w = d->wire;
    if (!w)
        return;
    wire_line_t l = {.scope = scope};
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l.text, sizeof(l.text) - 1, fmt, ap);
    va_end(ap);
    if (n <= 0)
        return;
    n = PAT_MIN(n, (int)sizeof(l.text) - 2);
    l.text[n++] = '\n';
    l.len = (uint16_t)n;
    pthread_mutex_lock(&w->ev_mu);
    if (!w->ev_async_on) { /* stopped (or not started) */
        pthread_mutex_unlock(&w->ev_mu);
        return;
    }
    if (w->ring_len == WIRE_RING) { /* the loop fell behind: the oldest goes */
        w->ring_head = (w->ring_head + 1) % WIRE_RING;
        w->ring_len--;
        w->ev_dropped++;
    }
    w->ring[(w->ring_head + w->ring_len) % WIRE_RING] = l;
    w->ring_len++;
    uv_async_send(&w->ev_async); /* under ev_mu: never after stop closed it */
    pthread_mutex_unlock(&w->ev_mu);
}

static int sees(const patd_t *d, const wire_conn_t *wc, uint64_t scope)
{
    return scope == 0 || scope == PATD_SCOPE_UID(wc->cred.uid) || patd_may_administer(d, &wc->cred);
}

static void on_events(uv_async_t *a)
{
    patd_wire_t *w = a->data;
    patd_t *d = w->d;
    wire_line_t l;
    for (;;) {
        pthread_mutex_lock(&w->ev_mu);
        uint64_t dropped = w->ev_dropped;
        w->ev_dropped = 0;
        int have = w->ring_len > 0;
        if (have) {
            l = w->ring[w->ring_head];
            w->ring_head = (w->ring_head + 1) % WIRE_RING;
            w->ring_len--;
        }
        pthread_mutex_unlock(&w->ev_mu);
        if (dropped)
            rlog(w, RL_RING, 4, "events: %llu lines dropped (more than %u waited)",
                 (unsigned long long)dropped, WIRE_RING);
        if (!have)
            return;
        for (uint32_t i = 0; i < w->n_slots; i++) {
            wire_conn_t *wc = w->slot[i];
            if (!wc || !wc->sub || wc->closing || !sees(d, wc, l.scope))
                continue;
            if (conn_write(wc, l.text, l.len, WIRE_SUB_QUEUE) < 0) {
                rlog(w, RL_SLOW, 5, "events: subscriber pid %d uid %u let %u KiB queue up; closed",
                     (int)wc->cred.pid, (unsigned)wc->cred.uid, WIRE_SUB_QUEUE >> 10);
                conn_close(wc, NULL);
            }
        }
    }
}

/* ------------------------------------------------------------------ life */
static int listen_on(patd_t *d, uv_pipe_t *p, const char *path, uv_connection_cb cb)
{
    unlink(path); /* a stale one of ours: the runtime directory is ours alone */
    uv_pipe_init(&d->loop, p, 0);
    p->data = d->wire;
    mode_t old = umask(0077); /* no window in which the socket is more open than asked */
    int rc = uv_pipe_bind(p, path);
    umask(old);
    if (rc == 0)
        rc = patd_socket_own(d, path);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)p, 128, cb);
    if (rc < 0) {
        patd_err("bind %s: %s", path, rc < -4095 ? strerror(-rc) : uv_strerror(rc));
        uv_close((uv_handle_t *)p, NULL);
    }
    return rc;
}

int patd_wire_start(patd_t *d)
{
    const patd_config_t *cfg = &d->cfg;
    patd_wire_t *w = pat_xcalloc(1, sizeof(*w));
    d->wire = w;
    w->d = d;
    /* a session's control connection each, and the unbound ones; max_conns may grow on reload */
    w->n_slots = 4096u + WIRE_UNBOUND_MAX + WIRE_SUBS_MAX;
    w->slot = pat_xcalloc(w->n_slots, sizeof(*w->slot));
    w->gen = pat_xcalloc(w->n_slots, sizeof(*w->gen));
    w->ring = pat_xcalloc(WIRE_RING, sizeof(*w->ring));
    /* the largest valid request: a max_seq_len prompt, or a full step, with room for its fixed
     * part; a frame announcing more is answered -E2BIG before any of its body is read */
    w->max_body = sizeof(ipc_step_begin_req_t) + 8ull * cfg->conn_max_seqs +
                  4ull * PAT_MAX(cfg->max_seq_len, cfg->conn_max_batch_tokens) + 65536;
    w->max_body = PAT_MIN(w->max_body, (uint64_t)IPC_MAX_FRAME - sizeof(ipc_hdr_t));
    struct rlimit rl;
    w->fd_limit =
        getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < INT32_MAX ? (int)rl.rlim_cur : 1 << 20;
    w->fd_reserve = PAT_MAX(16, w->fd_limit / 8);
    pthread_mutex_init(&w->ev_mu, NULL);
    uv_timer_init(&d->loop, &w->lost_timer);
    w->lost_timer.data = w;
    uv_async_init(&d->loop, &w->ev_async, on_events);
    w->ev_async.data = w;
    w->ev_async_on = 1;
    int rc = listen_on(d, &w->ctl, d->sock_path, on_ctl_connection);
    if (rc < 0)
        return rc;
    w->ctl_on = 1;
    if ((rc = listen_on(d, &w->ev, d->ev_path, on_ev_connection)) < 0)
        return rc;
    w->ev_on = 1;
    return 0;
}

void patd_wire_unlisten(patd_t *d)
{
    patd_wire_t *w = d->wire;
    if (!w)
        return;
    if (w->ctl_on) {
        uv_close((uv_handle_t *)&w->ctl, NULL);
        unlink(d->sock_path);
        w->ctl_on = 0;
    }
    if (w->ev_on) {
        uv_close((uv_handle_t *)&w->ev, NULL);
        unlink(d->ev_path);
        w->ev_on = 0;
    }
}

void patd_wire_stop(patd_t *d)
{
    patd_wire_t *w = d->wire;
    if (!w)
        return;
    for (uint32_t i = 0; i < w->n_slots; i++)
        if (w->slot[i])
            conn_close(w->slot[i], NULL);
    patd_wire_unlisten(d);
    uv_close((uv_handle_t *)&w->lost_timer, NULL);
    if (w->ev_async_on) {
        pthread_mutex_lock(&w->ev_mu);
        w->ev_async_on = 0;
        pthread_mutex_unlock(&w->ev_mu);
        uv_close((uv_handle_t *)&w->ev_async, NULL);
    }
    /* the handles close on the loop's last turns (main runs it once more); w stays until exit */
}

uint32_t patd_wire_unbound(const patd_t *d)
{
    return d->wire ? d->wire->n_unbound : 0;
}

uint32_t patd_wire_subscribers(const patd_t *d)
{
    return d->wire ? d->wire->n_subs : 0;
}
