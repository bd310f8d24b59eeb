/*
 * pat_client.c — libpat: sessions with patd over its control socket (a Unix stream of frames,
 * ipc_proto.h), staging buffers in shared memory, and the per-layer hand-off through futex signal
 * words (ipc_shm.h).
 *
 * One control connection per session, one request outstanding at a time (the daemon reads the
 * next frame only once it has answered the last). pat_step_begin() sends and
 * returns; the answer is collected before anything else is sent (usually by the first
 * pat_attend, while the frontend has computed its first layer meanwhile). Every wait is sliced
 * (receive timeout 50 ms, futex slices 20 ms): between slices the library checks that the
 * daemon still lives (a pidfd on its pid), so a dead daemon is reported as -ECONNRESET within
 * a slice instead of after the full timeout.
 *
 * GPU sessions (a daemon on the cuda backend): the staging rows are device memory and the
 * hand-off is enqueued on the caller's CUDA stream (pat_gpu.c); nothing in a step waits on the
 * CPU until pat_step_end. A watcher thread (poll on the daemon's pidfd) releases every handshake
 * the caller's stream may wait on when the daemon dies, so the frontend's GPU work never hangs on
 * a daemon that is gone; libpat calls report -ECONNRESET from then on.
 *
 * Not thread-safe per connection (pat.h). Host OOM aborts, like the rest of patd, reported as
 * libpat's (oom_report below), not the daemon's. The environment is read with secure_getenv: a
 * set-uid frontend does not take its socket path from whoever started it.
 */
#include "pat.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ipc_proto.h"
#include "ipc_shm.h"
#include "pat_base.h"
#include "pat_gpu.h"

#define RECV_SLICE_MS 50
#define SPIN_ITERS    4000 /* ~20-40 us of polling before sleeping on the futex */

enum { ST_IDLE, ST_SENT, ST_BEGUN, ST_FAILED };

struct pat_conn {
    int sock;
    int lost;       /* the daemon went away: sticky lost_rc */
    int lost_rc;    /* -ESTALE: another patd instance answers at the socket; else -ECONNRESET */
    char path[256]; /* the control socket (to ask who answers there now) */
    int gone;       /* the daemon forgot the session (-ENOTCONN): sticky */
    int transport;  /* the last call failed locally (timeout, send), not by the daemon's answer */
    int old_daemon; /* SEQ_OPEN_PENDING refused (a daemon older than 1.7): SEQ_OPEN only */
    int daemon_pidfd;
    pid_t daemon_pid;
    uint32_t timeout_ms;
    uint64_t session, instance, corr;
    ipc_hello_rep_t hello;
    ipc_layout_t lay; /* of the staging buffer, checked equal to the daemon's at connect */
    pat_model_t model;
    ipc_shm_t shm;
    ipc_buf_t tx;
    char err[IPC_ERRMSG_LEN + 64];
    /* the step */
    int step_state;
    int step_err;
    uint64_t pend_corr; /* the STEP_BEGIN whose answer is still to be received */
    uint64_t step_id;
    uint32_t tick_base, next_layer, n_tokens;
    ipc_step_begin_rep_t begin_rep;
    pat_conn_stats_t stats;
    /* GPU sessions */
    pat_gpu_t *gpu;           /* NULL: a cpu (shm) session */
    uint64_t *gready, *gdone; /* the handshake words in the signal slice (CPU and device) */
    uint64_t epoch;           /* handshake value of the step (read at pat_step_begin) */
    void *last_stream;        /* where the step's last hand-off went: pat_step_end pads there */
    pthread_t watcher;
    int watch_efd;          /* eventfd: tells the watcher to exit; -1 when none runs */
    _Atomic int lost_async; /* the watcher saw the daemon die */
};

/* pat.h's admin operations are the wire's opcodes: one value each, checked here */
#define PAT__SAME_OP(x) ((int)PAT_ADMIN_##x == (int)IPC_OP_##x)
_Static_assert(PAT__SAME_OP(STATUS) && PAT__SAME_OP(STATS) && PAT__SAME_OP(SEQS) &&
                   PAT__SAME_OP(DRAIN) && PAT__SAME_OP(RELOAD) && PAT__SAME_OP(CHECK) &&
                   PAT__SAME_OP(UPGRADE),
               "pat_admin_op_t follows ipc_proto.h's opcodes");
#undef PAT__SAME_OP

/* The session's signal page: the staging buffer's first page (cpu), or the signal slice's */
static ipc_sig_t *conn_sig(pat_conn_t *c)
{
    return c->gpu ? (ipc_sig_t *)pat__gpu_sig(c->gpu) : ipc_shm_sig(&c->shm);
}

/* Host OOM inside the frontend's process names libpat, not patd (pat_base.h). Installed when
 * the library is loaded, before any call can allocate; libpat.so's copy of daemon/base is its
 * own (hidden symbols), so this touches no other library's handler. */
static void oom_report(size_t bytes)
{
    fprintf(stderr, "libpat: host out of memory allocating %zu bytes\n", bytes);
}

__attribute__((constructor)) static void oom_install(void)
{
    pat_set_oom_handler(oom_report);
}

uint32_t pat_version(void)
{
    return PAT_VERSION;
}

/* What each code means from any public call that returns it (pat.h documents which call returns
 * what). The daemon's error table (ipc_err_text) names what a request was refused for; a few of
 * its codes mean something else from the library's own calls (-ENOENT from pat_connect is no
 * daemon, not an unknown sequence; -ENOTSUP from pat_attend_async is a host session), so these
 * texts cover every call's meaning. */
static const struct {
    int code;
    const char *text;
} client_errors[] = {
    {-ENOENT, "not found: no daemon (no socket at the path: pat_connect, pat_status, "
              "pat_admin), or a sequence id this session does not hold"},
    {-EOPNOTSUPP, "not supported: a GPU call on a host-memory session, or a request this daemon "
                  "does not offer (older release, retired opcode)"},
    {-ESRCH, "no step open (or no such step in flight)"},
    {-ETIMEDOUT, "timed out waiting for patd (a request, or a layer of the step)"},
    {-EIO, "a CUDA call failed (pat_last_error says which)"},
    {-EINVAL, "invalid argument or field value"},
    {-EPERM, "not permitted: only patd's user, root or daemon.admin_group may do this"},
    {-ECONNREFUSED, "no daemon (stale socket left by a crashed patd)"},
    {-ESTALE, "patd restarted since this session began (another instance answers): its "
              "sequences and KV are gone; reconnect"},
    {-EACCES, "permission denied on the socket (not in its group?)"},
};

const char *pat_strerror(int err)
{
    if (err == 0)
        return "success";
    if (err > 0)
        err = -err;
    for (size_t i = 0; i < PAT_ARRAY_SIZE(client_errors); i++)
        if (client_errors[i].code == err)
            return client_errors[i].text;
    const char *t = ipc_err_text(err);
    if (t)
        return t;
    return strerror(-err);
}

const char *pat_default_socket(void)
{
    static __thread char buf[512];
    const char *s = secure_getenv("PATD_SOCKET");
    if (s && *s)
        return s;
    const char *x = secure_getenv("XDG_RUNTIME_DIR");
    if (geteuid() == 0)
        return "/run/patd/patd.sock";
    if (x && *x)
        snprintf(buf, sizeof(buf), "%.480s/patd/patd.sock", x);
    else
        snprintf(buf, sizeof(buf), "/tmp/patd-%u/patd.sock", (unsigned)geteuid());
    return buf;
}

static void set_err(pat_conn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(pat_conn_t *c, const char *fmt, ...)
{
    if (!c)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

uint64_t pat_instance(const pat_conn_t *c, uint64_t *ret_start_unix_s)
{
    if (ret_start_unix_s)
        *ret_start_unix_s = c ? c->hello.start_unix_s : 0;
    return c ? c->instance : 0;
}

const char *pat_last_error(const pat_conn_t *c)
{
    return c ? c->err : "";
}

/* 1 if the daemon is known gone. */
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
            set_err(c,
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
            set_err(c,
                    "patd restarted: instance %016llx (started at %llu.%03llu) answers, this "
                    "session was with %016llx (pid %d); its sequences are gone: reconnect",
                    (unsigned long long)other_instance, (unsigned long long)(other_start_ms / 1000),
                    (unsigned long long)(other_start_ms % 1000), (unsigned long long)c->instance,
                    (int)c->daemon_pid);
        else
            set_err(c,
                    "patd restarted: instance %016llx answers, this session was with %016llx "
                    "(pid %d); its sequences are gone: reconnect",
                    (unsigned long long)other_instance, (unsigned long long)c->instance,
                    (int)c->daemon_pid);
    } else {
        c->lost_rc = -ECONNRESET;
        set_err(c, "patd (pid %d) went away; reconnect", (int)c->daemon_pid);
    }
}

static int daemon_gone(pat_conn_t *c)
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
        set_err(c, "%s",
                c->lost_rc == -ESTALE      ? "patd restarted since this session began: reconnect"
                : c->lost_rc == -ESHUTDOWN ? "patd shut down (drained) and ended this session"
                                           : "patd went away; reconnect");
    return c->lost;
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
            set_err(c, "%s %s", rows[i].what, path);
    return rc;
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
        if (c && daemon_gone(c))
            return c->lost_rc;
    }
}

/* A connection to the control socket at path (non-blocking, close-on-exec). A socket file
 * nothing listens on (what a crashed patd leaves) is refused at once. Returns 0 and *ret_sock,
 * -ENOENT, -ENOTSOCK, -ECONNREFUSED (stale), -ETIMEDOUT (its backlog stayed full), or another
 * errno. */
static int open_socket(const char *path, uint32_t timeout_ms, int *ret_sock)
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
    for (int i = 0; i < 10 && !ended && !daemon_gone(c); i++)
        usleep(20000);
    if (daemon_gone(c))
        return c->lost_rc;
    if (ended)
        set_err(c,
                "patd (pid %d) ended this session (a drain, an upgrade's handover, a lease or a "
                "cut: its log says which); reconnect",
                (int)c->daemon_pid);
    else
        set_err(c, "patd (pid %d) closed this session's control connection", (int)c->daemon_pid);
    return -ECONNRESET;
}

/* Receives the answer to request corr into *ret (malloc'd: free it). Answers to other requests
 * (one that timed out here and was answered late) are skipped. */
static int recv_reply(pat_conn_t *c, int sock, uint64_t corr, uint32_t timeout_ms, void **ret,
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
                set_err(c, "the daemon's answer is not a protocol %u frame (%s)",
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
static int send_frame(pat_conn_t *c, int sock, const ipc_buf_t *b, uint32_t timeout_ms)
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
static int parse_reply(pat_conn_t *c, const void *msg, size_t len, const void **ret_body,
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
        set_err(c, "%s", e.msg);
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

static int collect_pending(pat_conn_t *c);

/* One request: collect a pending step answer first, send, receive, check. The answer body is
 * copied into out (exactly out_len bytes expected, or any length when out_len is SIZE_MAX and
 * *ret_text receives a malloc'd copy). */
static int call(pat_conn_t *c, uint32_t op, const void *body, size_t len, const void *body2,
                size_t len2, void *out, size_t out_len)
{
    c->transport = 1;
    if (daemon_gone(c))
        return c->lost_rc;
    if (c->gone && op != IPC_OP_HELLO)
        return -ENOTCONN;
    int rc = collect_pending(c);
    if (rc == -ECONNRESET)
        return rc;
    ipc_frame_start(&c->tx, op, 0, ++c->corr, c->session);
    if (c->session)
        ipc_frame_set_key(&c->tx, c->hello.key);
    ipc_frame_put(&c->tx, body, len);
    ipc_frame_put(&c->tx, body2, len2);
    ipc_frame_finish(&c->tx);
    if ((rc = send_frame(c, c->sock, &c->tx, c->timeout_ms)) < 0) {
        if (daemon_gone(c))
            return c->lost_rc;
        set_err(c, "sending %s: %s", ipc_op_name(op), strerror(-rc));
        return rc;
    }
    void *msg;
    size_t n;
    if ((rc = recv_reply(c, c->sock, c->corr, c->timeout_ms, &msg, &n)) < 0) {
        if (rc == -ETIMEDOUT)
            set_err(c, "no answer to %s within %u ms", ipc_op_name(op), c->timeout_ms);
        return rc;
    }
    const void *rb;
    size_t rl;
    c->transport = 0;
    rc = parse_reply(c, msg, n, &rb, &rl);
    if (rc == -ENOTCONN && c->session)
        c->gone = 1;
    if (rc == 0 && out_len != rl)
        rc = -EBADMSG;
    if (rc == 0 && out_len)
        memcpy(out, rb, out_len);
    free(msg);
    return rc;
}

/* The answer to an outstanding STEP_BEGIN, if any. */
static int collect_pending(pat_conn_t *c)
{
    if (c->step_state != ST_SENT)
        return 0;
    void *msg;
    size_t n;
    int rc = recv_reply(c, c->sock, c->pend_corr, c->timeout_ms, &msg, &n);
    if (rc == 0) {
        const void *rb;
        size_t rl;
        rc = parse_reply(c, msg, n, &rb, &rl);
        if (rc == 0 && rl != sizeof(c->begin_rep))
            rc = -EBADMSG;
        if (rc == 0)
            memcpy(&c->begin_rep, rb, sizeof(c->begin_rep));
        free(msg);
    } else if (rc == -ETIMEDOUT) {
        set_err(c, "no answer to STEP_BEGIN within %u ms", c->timeout_ms);
    }
    if (rc < 0) {
        c->step_state = ST_FAILED;
        c->step_err = rc;
        return rc;
    }
    c->step_state = ST_BEGUN;
    c->step_id = c->begin_rep.step;
    c->tick_base = c->begin_rep.tick_base;
    c->next_layer = 0;
    return 0;
}

/* Releases every handshake word a stream of ours may wait on (the daemon is gone). */
static void release_waits(pat_conn_t *c)
{
    uint64_t e = atomic_load(&conn_sig(c)->epoch);
    uint64_t mine = __atomic_load_n(&c->epoch, __ATOMIC_RELAXED);
    if ((int64_t)(mine - e) > 0)
        e = mine;
    for (uint32_t l = 0; l < c->model.n_layers; l++)
        __atomic_store_n(&c->gdone[l], e, __ATOMIC_RELEASE);
}

static void *watch_main(void *arg)
{
    pat_conn_t *c = arg;
    /* the control connection's hang-up too: a daemon that ended this session (a drain, an
     * upgrade's handover) closes it, and may live on a while (its exit); the words are released
     * at once (POLLRDHUP: replies arriving on it do not wake this thread; the next call reads
     * why, as without this thread) */
    struct pollfd p[3] = {
        {c->watch_efd, POLLIN, 0}, {c->sock, POLLRDHUP, 0}, {c->daemon_pidfd, POLLIN, 0}};
    const nfds_t n = c->daemon_pidfd >= 0 ? 3 : 2;
    int dead = 0;
    for (;;) {
        /* after the daemon died the words are stored again every 50 ms: a graph replayed later
         * resets them as it goes */
        int r = poll(p, dead ? 1 : n, dead || n == 2 ? 50 : -1);
        if (r > 0 && (p[0].revents & POLLIN))
            return NULL;
        if (!dead && ((n == 3 && (p[2].revents & POLLIN)) ||
                      (n == 2 && kill(c->daemon_pid, 0) < 0 && errno == ESRCH))) {
            dead = 1;
            atomic_store(&c->lost_async, 1);
        } else if (!dead && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            dead = 1; /* the session ended; what the daemon said is read by the next call */
        }
        if (dead)
            release_waits(c);
    }
}

static int watcher_start(pat_conn_t *c)
{
    c->watch_efd = eventfd(0, EFD_CLOEXEC);
    if (c->watch_efd < 0)
        return -errno;
    int rc = pthread_create(&c->watcher, NULL, watch_main, c);
    if (rc) {
        close(c->watch_efd);
        c->watch_efd = -1;
        return -rc;
    }
    return 0;
}

static void watcher_stop(pat_conn_t *c)
{
    if (c->watch_efd < 0)
        return;
    uint64_t one = 1;
    if (write(c->watch_efd, &one, sizeof(one)) < 0) {
        /* an eventfd write cannot fail here; the join below would then block */
    }
    pthread_join(c->watcher, NULL);
    close(c->watch_efd);
    c->watch_efd = -1;
}

static int hello_unix(pat_conn_t *c, const char *control, const ipc_hello_req_t *r, int ret_fds[2]);

int pat_connect(const pat_connect_opts_t *o, pat_conn_t **ret, char *why, size_t why_len)
{
    char tmp[8];
    if (!why) {
        why = tmp;
        why_len = sizeof(tmp);
    }
    if (why_len)
        why[0] = 0;
    if (!o || !ret || o->size < offsetof(pat_connect_opts_t, reserved)) {
        snprintf(why, why_len, "opts missing or opts.size not set");
        return -EINVAL;
    }
    if (o->max_batch_tokens == 0 || o->max_batch_tokens > IPC_MAX_TOKENS) {
        snprintf(why, why_len, "max_batch_tokens must be 1..%u", IPC_MAX_TOKENS);
        return -EINVAL;
    }
    const char *path = o->socket ? o->socket : pat_default_socket();
    pat_conn_t *c = pat_xcalloc(1, sizeof(*c));
    c->daemon_pidfd = -1;
    c->timeout_ms = o->timeout_ms ? o->timeout_ms : 30000;
    c->model = o->model;
    ipc_buf_init(&c->tx);
    snprintf(c->path, sizeof(c->path), "%s", path);
    int rc = open_socket(path, c->timeout_ms, &c->sock);
    if (rc < 0) {
        snprintf(why, why_len, "cannot reach patd at %s: %s", path,
                 rc == -ECONNREFUSED ? pat_strerror(rc) : strerror(-rc));
        free(c);
        return rc;
    }
    if (o->buffer > PAT_BUFFER_GPU) {
        snprintf(why, why_len, "opts.buffer must be PAT_BUFFER_AUTO, _HOST or _GPU");
        free(c);
        return -EINVAL;
    }
    c->watch_efd = -1;
    ipc_hello_req_t r = {.pid = (uint32_t)getpid(),
                         .max_batch_tokens = o->max_batch_tokens,
                         .max_seqs = o->max_seqs,
                         .buffer_kind = o->buffer == PAT_BUFFER_HOST  ? IPC_BUF_SHM
                                        : o->buffer == PAT_BUFFER_GPU ? IPC_BUF_CUDA
                                                                      : 0,
                         .lease_ms = o->lease_ms};
    if (o->pack_policy > PAT_PACK_TREE) {
        snprintf(why, why_len, "opts.pack_policy %u is not a PAT_PACK_* value", o->pack_policy);
        close(c->sock);
        free(c);
        return -EINVAL;
    }
    r.flags = o->pack_policy & IPC_HELLO_PACK_MASK;
    r.model = (ipc_model_sig_t){o->model.n_layers, o->model.q_heads, o->model.kv_heads,
                                o->model.head_dim, o->model.dtype,   o->model.block_size,
                                o->model.model_id};
    if (o->label)
        snprintf(r.label, sizeof(r.label), "%s", o->label);
    int fds[2];
    rc = hello_unix(c, path, &r, fds);
    if (rc < 0) {
        snprintf(why, why_len, "HELLO: %s", c->err[0] ? c->err : pat_strerror(rc));
        goto fail;
    }
    c->session = c->hello.session;
    c->instance = c->hello.instance;
    c->daemon_pid = (pid_t)c->hello.daemon_pid;
    c->daemon_pidfd = ipc_pidfd_open(c->daemon_pid); /* < 0: kill(pid, 0) is the fallback */
    c->hello.shm_name[sizeof(c->hello.shm_name) - 1] = 0;
    uint32_t elt = o->model.dtype == PAT_F32 ? 4 : 2;
    const ipc_layout_t *l = &c->lay;
    const int on_gpu = c->hello.buffer_kind == IPC_BUF_CUDA;
    const int sfd = fds[0], gfd = fds[1];
    if (ipc_layout_compute(c->hello.max_batch_tokens, o->model.q_heads, o->model.kv_heads,
                           o->model.head_dim, elt, &c->lay) < 0 ||
        (on_gpu ? l->bytes != c->hello.dev_bytes || l->bytes > c->hello.dev_map_bytes
                : l->bytes != c->hello.buf_bytes) ||
        l->q_off != c->hello.q_off || l->k_off != c->hello.k_off || l->v_off != c->hello.v_off ||
        l->o_off != c->hello.o_off || (c->hello.buffer_kind != IPC_BUF_SHM && !on_gpu) ||
        (on_gpu &&
         (c->hello.sig_bytes < ipc_gsig_bytes(o->model.n_layers) || c->hello.sig_off != 0))) {
        snprintf(why, why_len, "daemon's buffer layout does not match this library's");
        rc = -EPROTO;
    } else if (sfd < 0 || (on_gpu && gfd < 0) || (!on_gpu && gfd >= 0)) {
        snprintf(why, why_len, "HELLO: the daemon sent %s buffer fds than a %s session has",
                 sfd < 0 || gfd < 0 ? "fewer" : "more", on_gpu ? "GPU" : "cpu");
        rc = -EPROTO;
    } else if (on_gpu) {
        rc = pat__gpu_open(c->hello.dev_uuid, gfd, c->hello.dev_map_bytes, sfd, c->hello.sig_bytes,
                           &c->gpu, why, why_len);
        const ipc_sig_t *g = rc == 0 ? pat__gpu_sig(c->gpu) : NULL;
        if (g && (g->magic != IPC_SIG_MAGIC || g->n_layers != o->model.n_layers)) {
            snprintf(why, why_len, "the daemon's signal slice does not match this library's");
            rc = -EPROTO;
        }
    } else {
        rc = ipc_shm_map_fd(&c->shm, sfd, c->hello.buf_bytes);
        if (rc < 0)
            snprintf(why, why_len, "mapping the staging buffer: %s", strerror(-rc));
    }
    /* the mappings (and the GPU import) hold what the descriptors named */
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    if (rc < 0)
        goto fail_session;
    if (on_gpu) {
        void *slice = pat__gpu_sig(c->gpu);
        c->gready = ipc_gsig_ready(slice);
        c->gdone = ipc_gsig_done(slice, o->model.n_layers);
        c->epoch = atomic_load(&conn_sig(c)->epoch);
        if ((rc = watcher_start(c)) < 0) {
            snprintf(why, why_len, "watcher thread: %s", strerror(-rc));
            goto fail_session;
        }
    }
    /* the first request binds the control connection to the session (the daemon closes one
     * that stays without a session for a few seconds) */
    if ((rc = call(c, IPC_OP_PING, NULL, 0, NULL, 0, NULL, 0)) < 0) {
        snprintf(why, why_len, "binding the control connection: %s",
                 c->err[0] ? c->err : pat_strerror(rc));
        goto fail_session;
    }
    *ret = c;
    return 0;
fail_session:
    pat__gpu_close(c->gpu);
    ipc_shm_close(&c->shm);
    call(c, IPC_OP_BYE, NULL, 0, NULL, 0, NULL, 0);
fail:
    if (c->daemon_pidfd >= 0)
        close(c->daemon_pidfd);
    close(c->sock);
    ipc_buf_done(&c->tx);
    free(c);
    return rc;
}

void pat_close(pat_conn_t *c)
{
    if (!c)
        return;
    if (!c->lost && c->session) {
        uint32_t t = c->timeout_ms;
        c->timeout_ms = PAT_MIN(t, 5000u);
        call(c, IPC_OP_BYE, NULL, 0, NULL, 0, NULL, 0);
    }
    watcher_stop(c);
    if (c->gpu) /* the session is over: no wait of ours may outlive it (pat__gpu_close syncs) */
        release_waits(c);
    pat__gpu_close(c->gpu);
    ipc_shm_close(&c->shm);
    if (c->daemon_pidfd >= 0)
        close(c->daemon_pidfd);
    close(c->sock);
    ipc_buf_done(&c->tx);
    free(c);
}

int pat_buffers(const pat_conn_t *c, pat_buffers_t *ret)
{
    if (!c || !ret)
        return -EINVAL;
    memset(ret, 0, sizeof(*ret));
    uint8_t *b = c->gpu ? pat__gpu_staging(c->gpu) : (uint8_t *)c->shm.base;
    ret->on_gpu = c->gpu != NULL;
    ret->mps = c->hello.mps;
    ret->q = b + c->lay.q_off;
    ret->k = b + c->lay.k_off;
    ret->v = b + c->lay.v_off;
    ret->o = b + c->lay.o_off;
    ret->q_row_bytes = c->lay.q_row;
    ret->kv_row_bytes = c->lay.kv_row;
    ret->max_batch_tokens = c->hello.max_batch_tokens;
    ret->max_seqs = c->hello.max_seqs;
    ret->max_blocks = c->hello.max_blocks;
    ret->lease_ms = c->hello.lease_ms;
    return 0;
}

int pat_ping(pat_conn_t *c)
{
    return c ? call(c, IPC_OP_PING, NULL, 0, NULL, 0, NULL, 0) : -EINVAL;
}

int pat_seq_open(pat_conn_t *c, const uint32_t *tokens, uint32_t n, uint32_t *ret_seq,
                 uint32_t *ret_cached_len)
{
    if (!c || !tokens || !n || !ret_seq)
        return -EINVAL;
    ipc_seq_open_req_t r = {.n_tokens = n};
    ipc_seq_rep_t rep;
    int rc = call(c, IPC_OP_SEQ_OPEN, &r, sizeof(r), tokens, (size_t)n * 4, &rep, sizeof(rep));
    if (rc < 0)
        return rc;
    *ret_seq = rep.seq;
    if (ret_cached_len)
        *ret_cached_len = rep.len;
    c->stats.prompt_tokens += n;
    c->stats.cached_tokens += rep.len;
    return 0;
}

int pat_seq_open_pending(pat_conn_t *c, const uint32_t *tokens, uint32_t n, uint32_t *ret_seq,
                         uint32_t *ret_cached_len, uint32_t *ret_pending_len)
{
    if (!c || !tokens || !n || !ret_seq)
        return -EINVAL;
    ipc_seq_open_req_t r = {.n_tokens = n};
    ipc_seq_open_rep_t rep;
    int rc = c->old_daemon ? -EOPNOTSUPP
                           : call(c, IPC_OP_SEQ_OPEN_PENDING, &r, sizeof(r), tokens, (size_t)n * 4,
                                  &rep, sizeof(rep));
    if (rc == -EOPNOTSUPP) { /* a daemon older than 1.7: asked once per session */
        c->old_daemon = 1;
        c->err[0] = 0;
        rep.pending = 0;
        rc = pat_seq_open(c, tokens, n, &rep.seq, &rep.len);
        if (rc < 0)
            return rc;
    } else if (rc < 0) {
        return rc;
    } else {
        c->stats.prompt_tokens += n;
        c->stats.cached_tokens += rep.len;
    }
    *ret_seq = rep.seq;
    if (ret_cached_len)
        *ret_cached_len = rep.len;
    if (ret_pending_len)
        *ret_pending_len = rep.pending;
    return 0;
}

static int seq_op(pat_conn_t *c, uint32_t op, uint32_t seq, uint32_t arg, uint32_t *ret_seq)
{
    if (!c)
        return -EINVAL;
    ipc_seq_req_t r = {seq, arg};
    ipc_seq_rep_t rep;
    int rc = call(c, op, &r, sizeof(r), NULL, 0, &rep, sizeof(rep));
    if (rc == 0 && ret_seq)
        *ret_seq = rep.seq;
    return rc;
}

int pat_seq_fork(pat_conn_t *c, uint32_t seq, uint32_t *ret_child)
{
    return ret_child ? seq_op(c, IPC_OP_SEQ_FORK, seq, 0, ret_child) : -EINVAL;
}

int pat_seq_truncate(pat_conn_t *c, uint32_t seq, uint32_t new_len)
{
    return seq_op(c, IPC_OP_SEQ_TRUNCATE, seq, new_len, NULL);
}

int pat_seq_close(pat_conn_t *c, uint32_t seq)
{
    return seq_op(c, IPC_OP_SEQ_CLOSE, seq, 0, NULL);
}

int pat_step_begin(pat_conn_t *c, const uint32_t *seqs, const uint32_t *n_new, uint32_t n_seqs,
                   const uint32_t *tokens)
{
    if (!c || !seqs || !n_new || !tokens || n_seqs == 0)
        return -EINVAL;
    if (daemon_gone(c))
        return c->lost_rc;
    if (c->gone)
        return -ENOTCONN;
    if (c->step_state != ST_IDLE) {
        set_err(c, "a step is open; end it first");
        return -EBUSY;
    }
    if (n_seqs > c->hello.max_seqs) {
        set_err(c, "%u sequences > max_seqs %u", n_seqs, c->hello.max_seqs);
        return -E2BIG;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        if (n_new[i] == 0) {
            set_err(c, "sequence #%u has 0 new tokens", i);
            return -EINVAL;
        }
        total += n_new[i];
    }
    if (total > c->hello.max_batch_tokens) {
        set_err(c, "%llu new tokens > max_batch_tokens %u", (unsigned long long)total,
                c->hello.max_batch_tokens);
        return -E2BIG;
    }
    ipc_step_begin_req_t r = {.n_seqs = n_seqs, .n_tokens = (uint32_t)total};
    ipc_frame_start(&c->tx, IPC_OP_STEP_BEGIN, 0, ++c->corr, c->session);
    ipc_frame_set_key(&c->tx, c->hello.key);
    ipc_frame_put(&c->tx, &r, sizeof(r));
    for (uint32_t i = 0; i < n_seqs; i++) {
        ipc_step_seq_t s = {seqs[i], n_new[i]};
        ipc_frame_put(&c->tx, &s, sizeof(s));
    }
    ipc_frame_put(&c->tx, tokens, total * 4);
    ipc_frame_finish(&c->tx);
    int rc = send_frame(c, c->sock, &c->tx, c->timeout_ms);
    if (rc < 0)
        return daemon_gone(c) ? c->lost_rc : rc;
    c->pend_corr = c->corr;
    c->step_state = ST_SENT;
    c->n_tokens = (uint32_t)total;
    if (c->gpu) { /* the hand-offs do not wait for the answer: it is collected at the end */
        c->next_layer = 0;
        c->last_stream = NULL;
        c->epoch = atomic_load(&conn_sig(c)->epoch);
    }
    return 0;
}

int pat_attend_async(pat_conn_t *c, uint32_t layer, void *stream)
{
    if (!c)
        return -EINVAL;
    if (!c->gpu) {
        set_err(c, "a host-memory (cpu backend) session: use pat_attend");
        return -ENOTSUP;
    }
    if (daemon_gone(c))
        return c->lost_rc;
    if (layer >= c->model.n_layers) {
        set_err(c, "layer %u of %u", layer, c->model.n_layers);
        return -EINVAL;
    }
    int cap = pat__gpu_capturing(c->gpu, stream);
    if (cap < 0) {
        set_err(c, "%s", pat__gpu_error(c->gpu));
        return cap;
    }
    uint64_t e = c->epoch;
    if (cap) {
        /* recorded into a graph, not run: no step needed; a replay hands over with these
         * values for as long as the epoch lasts (pat_gpu_epoch) */
        e = atomic_load(&conn_sig(c)->epoch);
    } else {
        if (c->step_state == ST_IDLE) {
            set_err(c, "no step open");
            return -ESRCH;
        }
        if (layer != c->next_layer) {
            set_err(c, "layer %u out of order (next is %u of %u)", layer, c->next_layer,
                    c->model.n_layers);
            return -EINVAL;
        }
    }
    int rc = pat__gpu_handoff(c->gpu, stream, &c->gready[layer], &c->gdone[layer], e,
                              layer + 1 == c->model.n_layers);
    if (rc < 0) {
        /* the wait may be enqueued already: release it so that our stream never hangs */
        __atomic_store_n(&c->gdone[layer], e, __ATOMIC_RELEASE);
        set_err(c, "%s", pat__gpu_error(c->gpu));
        return rc;
    }
    if (!cap) {
        c->next_layer++;
        c->last_stream = stream;
    }
    return 0;
}

int pat_step_replayed(pat_conn_t *c, void *stream)
{
    if (!c || !c->gpu)
        return -EINVAL;
    if (c->step_state == ST_IDLE) {
        set_err(c, "no step open");
        return -ESRCH;
    }
    if (c->next_layer != 0) {
        set_err(c, "layers were already handed over in this step");
        return -EINVAL;
    }
    c->next_layer = c->model.n_layers;
    c->last_stream = stream;
    return 0;
}

uint64_t pat_gpu_epoch(const pat_conn_t *c)
{
    return c && c->gpu ? atomic_load(&conn_sig((pat_conn_t *)c)->epoch) : 0;
}

int pat_attend(pat_conn_t *c, uint32_t layer)
{
    if (!c)
        return -EINVAL;
    if (c->gpu) { /* on the legacy default stream, and wait for it */
        int rc = pat_attend_async(c, layer, NULL);
        if (rc == 0 && (rc = pat__gpu_sync(c->gpu, NULL)) < 0)
            set_err(c, "%s", pat__gpu_error(c->gpu));
        if (rc == 0 && daemon_gone(c))
            rc = c->lost_rc;
        return rc;
    }
    if (daemon_gone(c))
        return c->lost_rc;
    int rc = collect_pending(c);
    if (rc < 0)
        return rc;
    if (c->step_state == ST_FAILED)
        return c->step_err;
    if (c->step_state != ST_BEGUN) {
        set_err(c, "no step open");
        return -ESRCH;
    }
    if (layer != c->next_layer || layer >= c->model.n_layers) {
        set_err(c, "layer %u out of order (next is %u of %u)", layer, c->next_layer,
                c->model.n_layers);
        return -EINVAL;
    }
    ipc_sig_t *g = ipc_shm_sig(&c->shm);
    uint32_t tick = c->tick_base + layer + 1;
    ipc_sig_post(&g->ready, tick); /* release: our Q/K/V stores happen-before */
    uint64_t deadline = pat_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    for (uint32_t spin = 0;; spin++) {
        uint32_t d = atomic_load_explicit(&g->done, memory_order_acquire);
        if ((int32_t)(d - tick) >= 0) {
            c->next_layer++;
            return 0;
        }
        uint32_t st = atomic_load_explicit(&g->state, memory_order_acquire);
        if (st != IPC_STATE_OPEN) {
            int e = atomic_load(&g->err);
            set_err(c, "daemon %s the step at layer %u: %s",
                    st == IPC_STATE_CLOSED ? "closed the session during" : "aborted", layer,
                    pat_strerror(e ? e : -ECANCELED));
            return e ? e : -ECANCELED;
        }
        if (spin < SPIN_ITERS) {
            __builtin_ia32_pause();
            continue;
        }
        if (daemon_gone(c))
            return c->lost_rc;
        if (pat_now_ns() > deadline) {
            set_err(c, "layer %u: no answer within %u ms", layer, c->timeout_ms);
            return -ETIMEDOUT;
        }
        ipc_sig_wait(&g->done, d, 20000000ull);
    }
}

int pat_step_end(pat_conn_t *c, int abort, pat_step_info_t *ret)
{
    if (!c)
        return -EINVAL;
    if (daemon_gone(c))
        return c->lost_rc;
    if (c->gpu && c->step_state != ST_IDLE) {
        /* every layer must be handed over for the daemon's stream to go through: the rest go on
         * the stream of the last one (their O is not used) */
        for (uint32_t l = c->next_layer; l < c->model.n_layers; l++) {
            int hr = pat__gpu_handoff(c->gpu, c->last_stream, &c->gready[l], &c->gdone[l], c->epoch,
                                      l + 1 == c->model.n_layers);
            if (hr < 0) {
                set_err(c, "%s", pat__gpu_error(c->gpu));
                return hr;
            }
            c->next_layer = l + 1;
        }
    }
    int rc = collect_pending(c);
    int begin_err = 0;
    if (c->step_state == ST_FAILED) {
        if (!c->gpu || rc == -ECONNRESET || c->transport) {
            c->step_state = ST_IDLE; /* the daemon never started it: nothing to end */
            return c->step_err;
        }
        begin_err = c->step_err; /* a GPU session's refused step still ends with STEP_END */
        rc = 0;
    }
    if (rc < 0)
        return rc;
    if (c->step_state != ST_BEGUN && !begin_err) {
        set_err(c, "no step open");
        return -ESRCH;
    }
    char begin_why[sizeof(c->err)];
    memcpy(begin_why, c->err, sizeof(begin_why));
    /* step 0: the step in flight (a refused step's id never reached us) */
    ipc_step_end_req_t r = {.step = begin_err ? 0 : c->step_id,
                            .flags = abort ? IPC_STEP_END_ABORT : 0};
    ipc_step_end_rep_t rep;
    rc = call(c, IPC_OP_STEP_END, &r, sizeof(r), NULL, 0, &rep, sizeof(rep));
    if (rc < 0 && c->transport)
        return rc; /* no answer: the step stays open; the caller may retry or reconnect */
    c->step_state = ST_IDLE;
    if (begin_err) {
        memcpy(c->err, begin_why, sizeof(begin_why));
        return begin_err;
    }
    if (rc < 0)
        return rc;
    if (rep.committed) {
        c->stats.steps++;
        c->stats.tokens += c->n_tokens;
        c->stats.kv_bytes += c->begin_rep.kv_bytes * c->model.n_layers;
        c->stats.qc_bytes += c->begin_rep.qc_bytes * c->model.n_layers;
    }
    if (ret) {
        memset(ret, 0, sizeof(*ret));
        ret->step = c->step_id;
        ret->n_tokens = c->begin_rep.n_tokens;
        ret->pack_reused = c->begin_rep.pack_reused;
        ret->pack_policy = c->begin_rep.pack_policy;
        ret->kv_bytes = c->begin_rep.kv_bytes;
        ret->qc_bytes = c->begin_rep.qc_bytes;
        ret->layers_done = rep.layers_done;
        ret->committed = rep.committed;
        ret->step_ns = rep.step_ns;
    }
    return 0;
}

int pat_stats(const pat_conn_t *c, pat_conn_stats_t *ret)
{
    if (!c || !ret)
        return -EINVAL;
    *ret = c->stats;
    return 0;
}

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

/* One request frame (b, correlation id corr) on the admin socket, where the daemon knows who
 * asks (SO_PEERCRED): the reply frame, malloc'd; -ENOENT / -ECONNREFUSED (no daemon: their
 * detail into tmp->err) or another negative errno. */
static int admin_call_unix(pat_conn_t *tmp, const char *control, const ipc_buf_t *b, uint64_t corr,
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

/* One HELLO on the admin socket (protocol 5): the daemon opens the session bound to this process
 * as the kernel names it (SO_PEERCRED; the HELLO's pid is only a claim) and passes the session's
 * buffers by fd (SCM_RIGHTS) beside the reply: a cpu session's staging memfd, or (protocol 7) a
 * GPU session's own signal slice and staging allocation. 0 with c->hello and ret_fds (-1: none
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
        set_err(c, "admin socket %s: %s", sa.sun_path, strerror(-fd));
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
        set_err(c, "sending the HELLO on %s: %s", sa.sun_path, strerror(-rc));
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
            set_err(c, "no HELLO reply on %s: %s", sa.sun_path, strerror(-rc));
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
            set_err(c, "reading the HELLO reply on %s: %s", sa.sun_path, strerror(-rc));
        } else if (k == 0) {
            rc = -ECONNRESET;
            set_err(c, "patd closed the connection on %s before its HELLO reply", sa.sun_path);
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
            set_err(c, "reading the HELLO reply on %s: %s", sa.sun_path, strerror(-rc));
    }
    if (rc == 0 && (rc = ipc_frame_check(msg, sizeof(h) + h.body_len, 1, &h)) == -EPROTONOSUPPORT)
        set_err(c,
                "the daemon speaks wire protocol %u, this libpat %u: use a libpat of the "
                "daemon's release",
                (unsigned)h.version, (unsigned)IPC_VERSION);
    else if (rc < 0 && !c->err[0])
        rc = -EBADMSG; /* the frame's own check: not a reply this libpat reads */
    const void *body = NULL;
    size_t blen = 0;
    if (rc == 0)
        rc = parse_reply(c, msg, sizeof(h) + h.body_len, &body, &blen);
    if (rc == 0 && (h.opcode != IPC_OP_HELLO || blen != sizeof(c->hello)))
        rc = -EBADMSG;
    close(fd);
    if (rc < 0) {
        for (int i = 0; i < n_got; i++)
            close(got[i]);
        if (rc == -EBADMSG && !c->err[0])
            set_err(c, "malformed HELLO reply on the admin socket");
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
static int hello_unix(pat_conn_t *c, const char *control, const ipc_hello_req_t *r, int ret_fds[2])
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
        set_err(c, "%s (%u tries in %.2f s)", last, tries, (pat_now_ns() - t0) / 1e9);
    }
    return rc;
}

/* One admin request: on the admin socket for those that change the daemon (DRAIN, RELOAD,
 * CHECK), on the control socket otherwise. 0 and the reply (a malloc'd copy; free it) with its
 * body, or a negative errno (the daemon's detail, or the socket no daemon answers at, into
 * tmp->err): -ENOENT and -ECONNREFUSED (a stale socket) come at once. */
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
    /* every admin request on the admin socket: the read-only ones are served there to anyone
     * the socket's mode lets in, the others to patd's user, root and daemon.admin_group */
    rc = admin_call_unix(tmp, path, &b, corr, timeout_ms, &msg, &n);
    ipc_buf_done(&b);
    if (rc < 0)
        return rc;
    if ((rc = parse_reply(tmp, msg, n, ret_body, ret_len)) < 0) {
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
    memcpy(ret, &st, st.size);
    return 0;
}

void pat_free(void *p)
{
    free(p);
}
