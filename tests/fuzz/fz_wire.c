/*
 * fz_wire.c — one fuzz input against one socket of a live patd (fz_wire.h): the table of the
 * sockets, the prefixes each can put before the input, and the connection itself, every step
 * non-blocking with a deadline so that a daemon that stops reading, answering or closing costs
 * the fuzzer at most the options' milliseconds per input.
 *
 * Tuned for throughput on a small machine: one socket per input, no allocation, replies read into
 * a stack buffer and kept only as far as the signature needs.
 */
#include "fz_wire.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "ipc_proto.h"

/* nanomsg's SP protocol ids (nanomsg/src/protocols/<p>; id = protocol * 16 + role) */
#define SP_PUB 0x20u
#define SP_SUB 0x21u
#define SP_REQ 0x30u
#define SP_REP 0x31u
/* the ipc transport's message types (nanomsg/src/transports/ipc/sipc.h): 1 is the only one a
 * peer sends on Linux; 1.1.5 asserts on anything else */
#define SIPC_MSG_NORMAL 1u

/* The sockets. The prefixes of a Unix socket mix nanomsg's framing (what the control and event
 * sockets spoke through protocol 7) and patd's own (what the admin socket speaks, and the control
 * socket after the transport moved off nanomsg): each socket must survive both. */
const fz_target_t fz_targets[] = {
    {"sock",
     ".sock",
     FZ_UNIX,
     SP_REQ,
     SP_REP,
     {FZ_PFX_NONE, FZ_PFX_SP, FZ_PFX_SP_WRONG, FZ_PFX_SP_BADMAGIC, FZ_PFX_SP_MSG, FZ_PFX_SP_MSGTYPE,
      FZ_PFX_FRAME, FZ_PFX_FRAME_SESS},
     {{0, 6}, {8, 4}, {40, 4}}, /* as the admin socket's; nanomsg's replies start alike */
     0},
    {"events",
     ".events",
     FZ_UNIX,
     SP_SUB,
     SP_PUB,
     {FZ_PFX_NONE, FZ_PFX_SP, FZ_PFX_SP_WRONG, FZ_PFX_SP_BADMAGIC, FZ_PFX_SP_MSG, FZ_PFX_SP_MSGTYPE,
      FZ_PFX_FRAME, FZ_PFX_FRAME_SESS},
     {{0, 8}},
     0},
    {"admin",
     ".admin",
     FZ_UNIX,
     SP_REQ,
     SP_REP,
     {FZ_PFX_NONE, FZ_PFX_FRAME, FZ_PFX_FRAME_SESS, FZ_PFX_SP, FZ_PFX_SP_MSG, FZ_PFX_SP_MSGTYPE,
      FZ_PFX_SP_BADMAGIC, FZ_PFX_SP_WRONG},
     {{0, 4}, {8, 4}, {40, 4}}, /* magic, flags, the error code: not the echoed opcode */
     0},
    {"metrics",
     NULL,
     FZ_TCP,
     SP_REQ,
     SP_REP,
     {FZ_PFX_NONE, FZ_PFX_HTTP_GET, FZ_PFX_HTTP_REQ, FZ_PFX_HTTP_POST, FZ_PFX_HTTP_CHUNKED,
      FZ_PFX_HTTP_PATH, FZ_PFX_FRAME, FZ_PFX_SP},
     {{0, 0}},
     1},
};
const size_t fz_n_targets = sizeof(fz_targets) / sizeof(fz_targets[0]);

/* Opcodes that end the daemon on request of a caller allowed to (the fuzzer runs as patd's user
 * or root, who are): an admin frame at the start of the stream with one of these becomes a
 * STATUS, or every such input would read as a death (UPGRADE: the daemon hands over to a
 * successor and exits). */
static const uint16_t ending_ops[] = {IPC_OP_DRAIN, IPC_OP_UPGRADE};

static const char *const prefix_names[] = {
    [FZ_PFX_NONE] = "none",
    [FZ_PFX_SP] = "sp",
    [FZ_PFX_SP_WRONG] = "sp-wrong-protocol",
    [FZ_PFX_SP_BADMAGIC] = "sp-bad-magic",
    [FZ_PFX_SP_MSG] = "sp+message",
    [FZ_PFX_SP_MSGTYPE] = "sp+message-type",
    [FZ_PFX_FRAME] = "frame-header",
    [FZ_PFX_FRAME_SESS] = "frame-header-session",
    [FZ_PFX_HTTP_GET] = "http-get-open",
    [FZ_PFX_HTTP_REQ] = "http-get+pipelined",
    [FZ_PFX_HTTP_POST] = "http-post",
    [FZ_PFX_HTTP_CHUNKED] = "http-chunked",
    [FZ_PFX_HTTP_PATH] = "http-path",
};

static const char *const end_names[] = {"close", "half-close+wait", "wait", "wait+reset"};
static const char *const fds_names[] = {"no fds", "1 fd", "8 fds once", "8 fds each send"};

const char *fz_prefix_name(fz_prefix_t p)
{
    return (size_t)p < sizeof(prefix_names) / sizeof(prefix_names[0]) ? prefix_names[p] : "?";
}

const fz_target_t *fz_target_find(const char *name)
{
    for (size_t i = 0; i < fz_n_targets; i++)
        if (!strcmp(fz_targets[i].name, name))
            return &fz_targets[i];
    return NULL;
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* milliseconds left until deadline (us), at least 0, for poll() */
static int ms_left(uint64_t deadline)
{
    uint64_t now = now_us();
    return now >= deadline ? 0 : (int)((deadline - now + 999) / 1000);
}

static size_t put_be(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    return (size_t)bytes;
}

static size_t put_sp(uint8_t *p, const char *magic4, uint16_t proto)
{
    memcpy(p, magic4, 4);
    put_be(p + 4, proto, 2);
    p[6] = p[7] = 0;
    return 8;
}

static size_t put_text(uint8_t *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return n;
}

size_t fz_prefix_build(const fz_target_t *t, fz_prefix_t p, uint8_t param, size_t len, uint8_t *out)
{
    static const char host[] = "Host: 127.0.0.1\r\n";
    size_t n = 0;
    switch (p) {
    case FZ_PFX_NONE:
        return 0;
    case FZ_PFX_SP:
        return put_sp(out, "\0SP\0", t->sp_peer);
    case FZ_PFX_SP_WRONG:
        return put_sp(out, "\0SP\0", t->sp_wrong);
    case FZ_PFX_SP_BADMAGIC:
        return put_sp(out, "\0SQ\0", t->sp_peer);
    case FZ_PFX_SP_MSG:
    case FZ_PFX_SP_MSGTYPE: {
        const int req = t->sp_peer == SP_REQ; /* a REQ peer's messages start with a request id */
        n = put_sp(out, "\0SP\0", t->sp_peer);
        out[n++] = p == FZ_PFX_SP_MSG ? SIPC_MSG_NORMAL : param;
        n += put_be(out + n, len + (req ? 4u : 0u), 8);
        if (req)
            n += put_be(out + n, 0x80000001u, 4);
        return n;
    }
    case FZ_PFX_FRAME:
    case FZ_PFX_FRAME_SESS: {
        ipc_hdr_t h = {.magic = IPC_MAGIC,
                       .version = IPC_VERSION,
                       .opcode = param,
                       .body_len = (uint32_t)len,
                       .corr = 1};
        if (p == FZ_PFX_FRAME_SESS) {
            h.session = 0x0123456789abcdefull ^ param;
            h.key = ~h.session;
        }
        memcpy(out, &h, sizeof(h));
        return sizeof(h);
    }
    case FZ_PFX_HTTP_GET:
        n = put_text(out, "GET /metrics HTTP/1.1\r\n");
        return n + put_text(out + n, host);
    case FZ_PFX_HTTP_REQ:
        n = put_text(out, "GET /metrics HTTP/1.1\r\n");
        n += put_text(out + n, host);
        return n + put_text(out + n, "\r\n");
    case FZ_PFX_HTTP_POST:
        n = put_text(out, "POST /metrics HTTP/1.1\r\n");
        n += put_text(out + n, host);
        return n + (size_t)snprintf((char *)out + n, FZ_PREFIX_MAX - n,
                                    "Content-Length: %zu\r\n\r\n", len);
    case FZ_PFX_HTTP_CHUNKED:
        n = put_text(out, "POST /metrics HTTP/1.1\r\n");
        n += put_text(out + n, host);
        return n + put_text(out + n, "Transfer-Encoding: chunked\r\n\r\n");
    case FZ_PFX_HTTP_PATH:
        return put_text(out, "GET /");
    }
    return 0;
}

void fz_mode_describe(const fz_target_t *t, const uint8_t *in, size_t len, char *out,
                      size_t out_len)
{
    const uint8_t mode = len > 0 ? in[0] : 0, param = len > 1 ? in[1] : 0;
    snprintf(out, out_len, "prefix %s, param 0x%02x, %s, %s%s, %zu payload bytes",
             fz_prefix_name(t->prefix[FZ_MODE_PREFIX(mode)]), param, end_names[FZ_MODE_END(mode)],
             t->family == FZ_TCP ? "no fds (tcp)" : fds_names[FZ_MODE_FDS(mode)],
             mode & FZ_MODE_CHUNKED ? ", 3 sends" : "", len > 2 ? len - 2 : 0);
}

/* An admin frame at the start of the stream whose opcode ends the daemon: made a STATUS. */
static uint32_t guard(uint8_t *wire, size_t n)
{
    ipc_hdr_t h;
    if (n < sizeof(h))
        return 0;
    memcpy(&h, wire, sizeof(h));
    if (h.magic != IPC_MAGIC)
        return 0;
    for (size_t i = 0; i < sizeof(ending_ops) / sizeof(ending_ops[0]); i++)
        if (h.opcode == ending_ops[i]) {
            h.opcode = IPC_OP_STATUS;
            memcpy(wire, &h, sizeof(h));
            return 1;
        }
    return 0;
}

static int connect_unix(const fz_target_t *t, const fz_endpoint_t *ep, uint64_t deadline,
                        fz_conn_class_t *cls)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%.90s/patd%s", ep->dir, t->suffix);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    for (;;) {
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            *cls = FZ_C_OK;
            return fd;
        }
        /* a Unix listener whose backlog is full answers EAGAIN: try again until the deadline */
        if (errno != EAGAIN || ms_left(deadline) == 0) {
            *cls = errno == EAGAIN                            ? FZ_C_BUSY
                   : errno == ECONNREFUSED || errno == ENOENT ? FZ_C_REFUSED
                                                              : FZ_C_ERROR;
            close(fd);
            return -1;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static int connect_tcp(const fz_endpoint_t *ep, uint64_t deadline, fz_conn_class_t *cls)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons(ep->port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        *cls = FZ_C_OK;
        return fd;
    }
    if (errno != EINPROGRESS) {
        *cls = errno == ECONNREFUSED ? FZ_C_REFUSED : FZ_C_ERROR;
        close(fd);
        return -1;
    }
    struct pollfd p = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t el = sizeof(err);
    if (poll(&p, 1, ms_left(deadline)) <= 0) {
        *cls = FZ_C_TIMEOUT;
        close(fd);
        return -1;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
        *cls = err == ECONNREFUSED ? FZ_C_REFUSED : FZ_C_ERROR;
        close(fd);
        return -1;
    }
    *cls = FZ_C_OK;
    return fd;
}

/* One send of n > 0 bytes, nfds copies of afd attached to its first sendmsg. Returns 0 or the
 * errno that stopped it (EAGAIN: the deadline passed with the peer not reading). */
static int send_chunk(int fd, const uint8_t *p, size_t n, int nfds, int afd, uint64_t deadline)
{
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(FZ_FDS_MANY * sizeof(int))];
    } ctl;
    size_t done = 0;
    while (done < n) {
        struct iovec iov = {(void *)(p + done), n - done};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        if (nfds > 0 && done == 0) {
            memset(&ctl, 0, sizeof(ctl));
            m.msg_control = ctl.buf;
            m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
            struct cmsghdr *c = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
            for (int i = 0; i < nfds; i++)
                memcpy(CMSG_DATA(c) + i * sizeof(int), &afd, sizeof(int));
        }
        ssize_t k = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EINTR)
            return errno;
        struct pollfd pf = {fd, POLLOUT, 0};
        int left = ms_left(deadline);
        if (left == 0 || poll(&pf, 1, left) == 0)
            return EAGAIN;
    }
    return 0;
}

/* Reads until the peer closes or the deadline; keeps the first bytes in o->reply. */
static fz_end_class_t wait_end(int fd, uint64_t deadline, fz_outcome_t *o)
{
    uint8_t buf[16384];
    for (;;) {
        struct pollfd pf = {fd, POLLIN, 0};
        int left = ms_left(deadline);
        if (left == 0 || poll(&pf, 1, left) == 0)
            return FZ_E_TIMEOUT;
        /* recv() without a control buffer: descriptors the daemon sends (a HELLO's) are closed
         * by the kernel, none reaches this process */
        ssize_t k = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (k == 0)
            return FZ_E_EOF;
        if (k < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            return FZ_E_RESET;
        }
        if (o->reply_len < sizeof(o->reply)) {
            size_t c = sizeof(o->reply) - o->reply_len;
            memcpy(o->reply + o->reply_len, buf, (size_t)k < c ? (size_t)k : c);
        }
        o->reply_len += (uint32_t)k;
    }
}

int fz_wire_run(const fz_target_t *t, const fz_endpoint_t *ep, const uint8_t *in, size_t len,
                const fz_wire_opts_t *o, fz_outcome_t *ret)
{
    const uint8_t mode = len > 0 ? in[0] : 0, param = len > 1 ? in[1] : 0;
    const uint8_t *pay = len > 2 ? in + 2 : in;
    const size_t plen = len > 2 ? len - 2 : 0;
    uint8_t wire[FZ_PREFIX_MAX + 65536];
    memset(ret, 0, sizeof(*ret));
    if (plen > sizeof(wire) - FZ_PREFIX_MAX)
        return -EMSGSIZE;
    size_t pre = fz_prefix_build(t, t->prefix[FZ_MODE_PREFIX(mode)], param, plen, wire);
    memcpy(wire + pre, pay, plen);
    const size_t n = pre + plen;
    ret->rewritten = guard(wire, n);

    /* the sends: the whole stream, or the prefix and three pieces of the payload */
    size_t cut[5] = {0, n, n, n, n};
    int n_chunks = 1;
    if (mode & FZ_MODE_CHUNKED) {
        size_t a = pre + plen * (param & 15u) / 16u;
        size_t b = a + (n - a) * (param >> 4) / 16u;
        size_t c = b + (n - b) / 2;
        const size_t pts[4] = {pre, a, b, c};
        n_chunks = 0;
        for (int i = 0; i < 4; i++)
            if (pts[i] > cut[n_chunks] && pts[i] < n)
                cut[++n_chunks] = pts[i];
        cut[++n_chunks] = n;
    }

    const uint64_t t0 = now_us();
    int fd = t->family == FZ_UNIX ? connect_unix(t, ep, t0 + 1000ull * o->connect_ms, &ret->conn)
                                  : connect_tcp(ep, t0 + 1000ull * o->connect_ms, &ret->conn);
    if (fd < 0)
        return ret->conn == FZ_C_OK ? fd : 0;

    const fz_fds_t fds = t->family == FZ_UNIX && o->fd >= 0 ? FZ_MODE_FDS(mode) : FZ_FDS_NONE;
    const uint64_t send_deadline = now_us() + 1000ull * o->send_ms;
    for (int i = 0; i < n_chunks && !ret->send_err; i++) {
        const int nfds = fds == FZ_FDS_NONE        ? 0
                         : fds == FZ_FDS_ONE       ? (i == 0)
                         : fds == FZ_FDS_MANY_ONCE ? (i == 0) * FZ_FDS_MANY
                                                   : FZ_FDS_MANY;
        if (cut[i + 1] > cut[i]) {
            ret->send_err =
                send_chunk(fd, wire + cut[i], cut[i + 1] - cut[i], nfds, o->fd, send_deadline);
            ret->sends += !ret->send_err;
        }
    }

    const fz_end_t end = FZ_MODE_END(mode);
    if (end == FZ_END_HALF_WAIT)
        shutdown(fd, SHUT_WR);
    ret->end = end == FZ_END_CLOSE ? FZ_E_NONE : wait_end(fd, now_us() + 1000ull * o->wait_ms, ret);
    if (end == FZ_END_WAIT_RST) {
        struct linger l = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    }
    close(fd);
    return 0;
}

static uint32_t fnv(uint32_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 16777619u;
    return h;
}

uint32_t fz_outcome_sig(const fz_target_t *t, uint8_t mode, const fz_outcome_t *o)
{
    const uint32_t len_class =
        o->reply_len ? 1u + (uint32_t)(31 - __builtin_clz(o->reply_len)) : 0u;
    const uint32_t err_class = o->send_err == 0 ? 0u : o->send_err == EAGAIN ? 1u : 2u;
    const uint32_t f[] = {(uint32_t)(t - fz_targets),
                          FZ_MODE_PREFIX(mode),
                          o->conn,
                          o->sends,
                          err_class,
                          o->end,
                          len_class};
    uint32_t h = fnv(2166136261u, f, sizeof(f));
    const size_t have = o->reply_len < sizeof(o->reply) ? o->reply_len : sizeof(o->reply);
    if (t->sig_http) {
        const uint8_t *eol = memchr(o->reply, '\r', have);
        return fnv(h, o->reply, eol ? (size_t)(eol - o->reply) : have);
    }
    for (size_t i = 0; i < 3 && t->sig[i].len && t->sig[i].off < have; i++) {
        const size_t end = t->sig[i].off + t->sig[i].len;
        h = fnv(h, o->reply + t->sig[i].off, (end < have ? end : have) - t->sig[i].off);
    }
    return h;
}
