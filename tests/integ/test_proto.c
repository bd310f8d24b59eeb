/*
 * test_proto.c — the wire protocol against a real patd: a table of malformed and refused
 * frames, each answered with its specific error code, the daemon still serving afterwards and
 * its pool consistent; plus the session operations (open/fork/truncate/close, quotas) through
 * libpat.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <fcntl.h>
#include <poll.h>

#include <cmocka.h>

#include "ipc_proto.h"
#include "pat.h"
#include "tl_client.h"
#include "tl_daemon.h"
#include "tl_wire.h"

static tl_daemon_t D;
static const pat_model_t MODEL = {4, 8, 2, 64, PAT_F16, 16, 0};

static int setup(void **state)
{
    static const char *const args[] = {"--max-seq-len=512",           "--conn-max-seqs=8",
                                       "--conn-max-batch-tokens=256", "--blocks=256",
                                       "--conn-max-blocks=64",        NULL};
    return tl_daemon_start(&D, args);
}

static int teardown(void **state)
{
    int rc = tl_daemon_signal_wait(&D, SIGTERM, 5000);
    tl_daemon_stop(&D);
    return rc == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- raw frames */
/* A connection to the control socket (protocol 8: a stream of frames, one per request). */
static int raw_socket(void)
{
    int s = tl_wire_open(D.sock);
    assert_true(s >= 0);
    return s;
}

/* The sessions raw HELLOs opened: their keys (frame_make puts them in; an unknown session gets
 * key 0) and their control connections. A session's requests travel on a connection of its
 * own, bound to it by the first (raw_call routes them). */
static struct {
    uint64_t session, key;
    int fd; /* its control connection + 1; 0: none yet, or closed */
} g_keys[64];
#define RAW_CLOSED 1 /* raw_call: the daemon closed the connection without an answer */

static uint64_t key_of(uint64_t session)
{
    for (size_t i = 0; session && i < sizeof(g_keys) / sizeof(g_keys[0]); i++)
        if (g_keys[i].session == session)
            return g_keys[i].key;
    return 0;
}

static void key_keep(const ipc_hello_rep_t *rep)
{
    static size_t next;
    size_t i = next++ % (sizeof(g_keys) / sizeof(g_keys[0]));
    if (g_keys[i].fd)
        close(g_keys[i].fd - 1);
    g_keys[i].session = rep->session;
    g_keys[i].key = rep->key;
    g_keys[i].fd = 0;
}

/* Where a frame for session goes: that session's connection (opened on first use), or g_ctl
 * for session 0 and for sessions no raw HELLO opened. *ret_slot: its g_keys row, or -1. */
static int route(uint64_t session, int *ret_slot)
{
    *ret_slot = -1;
    for (size_t i = 0; session && i < sizeof(g_keys) / sizeof(g_keys[0]); i++)
        if (g_keys[i].session == session) {
            if (!g_keys[i].fd)
                g_keys[i].fd = raw_socket() + 1;
            *ret_slot = (int)i;
            return g_keys[i].fd - 1;
        }
    /* session 0, or a session of no raw HELLO: a connection of its own, used once (one
     * without a session is closed after a few idle seconds) */
    *ret_slot = -2;
    return raw_socket();
}

/* The connection a frame went out on was closed by the daemon: forget it. */
static void unroute(int fd, int slot)
{
    close(fd);
    if (slot >= 0)
        g_keys[slot].fd = 0;
}

/* The control connection of a session a raw HELLO opened (for frames sent without raw_call). */
static int sess_fd(uint64_t session)
{
    int slot;
    return route(session, &slot);
}

/* A frame on the admin socket beside D.sock (where HELLO is served): the answer's code; a
 * success reply's body into body (body_len bytes), the fd that came beside it (or -1) into
 * *ret_fd when given, else closed. A HELLO's session key is kept for frame_make. */
static int raw_admin(const void *frame, size_t len, void *body, size_t body_len, int *ret_fd)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(D.sock);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%.*s.admin", (int)(n - 5), D.sock);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(write(fd, frame, len), (ssize_t)len);
    uint8_t msg[sizeof(ipc_hdr_t) + sizeof(ipc_hello_rep_t)];
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {msg, sizeof(ipc_hdr_t)};
    struct msghdr m = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = ctl.buf,
                       .msg_controllen = sizeof(ctl.buf)};
    ssize_t k = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    assert_int_equal(k, (ssize_t)sizeof(ipc_hdr_t));
    int got = -1;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
        if (cm->cmsg_type == SCM_RIGHTS)
            memcpy(&got, CMSG_DATA(cm), sizeof(int));
    ipc_hdr_t r;
    memcpy(&r, msg, sizeof(r));
    assert_true(r.body_len <= sizeof(msg) - sizeof(r));
    for (size_t have = 0; have < r.body_len;) { /* the body may come in later reads */
        ssize_t more = read(fd, msg + sizeof(r) + have, r.body_len - have);
        assert_true(more > 0);
        have += (size_t)more;
    }
    close(fd);
    assert_int_equal(ipc_frame_check(msg, sizeof(r) + r.body_len, 1, &r), 0);
    int code = 0;
    if (r.flags & IPC_F_ERROR) {
        ipc_err_body_t e;
        assert_int_equal(r.body_len, sizeof(e));
        memcpy(&e, msg + sizeof(r), sizeof(e));
        code = e.code;
        assert_non_null(memchr(e.msg, 0, sizeof(e.msg)));
        assert_int_equal(got, -1); /* no fd comes with a refusal */
    } else {
        if (body) {
            assert_int_equal(r.body_len, body_len);
            memcpy(body, msg + sizeof(r), body_len);
        }
        if (r.opcode == IPC_OP_HELLO && r.body_len == sizeof(ipc_hello_rep_t)) {
            ipc_hello_rep_t rep;
            memcpy(&rep, msg + sizeof(r), sizeof(rep));
            key_keep(&rep);
        }
    }
    if (ret_fd)
        *ret_fd = got;
    else if (got >= 0)
        close(got);
    return code;
}

/* Sends a frame, returns the error code of the answer (0 for a success reply, RAW_CLOSED when
 * the daemon closed the connection without one); body out. HELLO frames go to the admin socket,
 * where it is served (raw_admin); the rest where route() says (s is the caller's connection of
 * old, before sessions had connections of their own: unused). A frame shorter than it says (its
 * header, or its body) is followed by the end of the connection's writing side, as a client
 * that gives up would. */
static int raw_call(int s, const void *frame, size_t len, void *body, size_t body_len)
{
    (void)s;
    ipc_hdr_t fh = {0};
    if (len >= sizeof(fh)) {
        memcpy(&fh, frame, sizeof(fh));
        if (fh.opcode == IPC_OP_HELLO && fh.magic == IPC_MAGIC)
            return raw_admin(frame, len, body, body_len, NULL);
    }
    int slot;
    const int fd = route(fh.session, &slot);
    assert_int_equal(tl_wire_send(fd, frame, len), 0);
    if (len < sizeof(fh) || len < sizeof(fh) + fh.body_len)
        shutdown(fd, SHUT_WR);
    void *msg = NULL;
    int n = tl_wire_recv(fd, &msg);
    if (n == 0 || (len < sizeof(fh) || len < sizeof(fh) + fh.body_len)) {
        if (n > 0)
            free(msg);
        unroute(fd, slot);
        return n == 0 ? RAW_CLOSED : -EPROTO;
    }
    ipc_hdr_t rh;
    const int bye_ok = fh.opcode == IPC_OP_BYE && slot >= 0 &&
                       ipc_frame_check(msg, (size_t)n, 1, &rh) == 0 && !(rh.flags & IPC_F_ERROR);
    if (slot == -2 || bye_ok) {
        unroute(fd, slot); /* a BYE's connection ends with its session */
    } else {
        /* an answer the daemon closed the connection after (a frame it could not read past) */
        struct pollfd p = {fd, POLLRDHUP, 0};
        if (poll(&p, 1, 100) == 1 && (p.revents & (POLLRDHUP | POLLHUP)))
            unroute(fd, slot);
    }
    assert_true(n >= (int)sizeof(ipc_hdr_t));
    ipc_hdr_t h;
    assert_int_equal(ipc_frame_check(msg, (size_t)n, 1, &h), 0);
    int code = 0;
    if (h.flags & IPC_F_ERROR) {
        ipc_err_body_t e;
        assert_int_equal(h.body_len, sizeof(e));
        memcpy(&e, (uint8_t *)msg + sizeof(h), sizeof(e));
        code = e.code;
        assert_non_null(memchr(e.msg, 0, sizeof(e.msg)));
    } else if (body) {
        assert_int_equal(h.body_len, body_len);
        memcpy(body, (uint8_t *)msg + sizeof(h), body_len);
    }
    free(msg);
    return code;
}

typedef struct frame {
    uint8_t b[4096];
    size_t len;
} frame_t;

static void frame_make(frame_t *f, uint32_t op, uint64_t session, const void *body, size_t len)
{
    static uint64_t corr = 100; /* a fresh id per frame: a repeated one means "resend" */
    ipc_hdr_t h = {.magic = IPC_MAGIC,
                   .version = IPC_VERSION,
                   .opcode = (uint16_t)op,
                   .body_len = (uint32_t)len,
                   .corr = ++corr,
                   .session = session,
                   .key = key_of(session)};
    memcpy(f->b, &h, sizeof(h));
    if (len)
        memcpy(f->b + sizeof(h), body, len);
    f->len = sizeof(h) + len;
}

static ipc_hello_req_t good_hello(void)
{
    ipc_hello_req_t r = {.model = {4, 8, 2, 64, PAT_F16, 16, 0},
                         .pid = (uint32_t)getpid(),
                         .max_batch_tokens = 64,
                         .buffer_kind = IPC_BUF_SHM};
    snprintf(r.label, sizeof(r.label), "raw");
    return r;
}

static uint64_t raw_hello(int s)
{
    frame_t f;
    ipc_hello_req_t r = good_hello();
    ipc_hello_rep_t rep;
    frame_make(&f, IPC_OP_HELLO, 0, &r, sizeof(r));
    assert_int_equal(raw_call(s, f.b, f.len, &rep, sizeof(rep)), 0);
    assert_int_not_equal(rep.session, 0);
    return rep.session;
}

typedef void (*mutate_fn)(frame_t *f, uint64_t session, uint32_t seq, uint64_t other_sess);

#define HDR(f) ((ipc_hdr_t *)(f)->b)
static void m_short(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_PING, s, NULL, 0);
    f->len = 10;
}
static void m_magic(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_PING, s, NULL, 0);
    HDR(f)->magic ^= 1;
}
static void m_key_alone(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_STATUS, 0, NULL, 0);
    HDR(f)->key = 1; /* a key with no session */
}
static void m_key_wrong(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_PING, s, NULL, 0);
    HDR(f)->key ^= 1; /* the id alone, as whoever learnt it */
}
static void m_key_other(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_BYE, s, NULL, 0);
    HDR(f)->key = key_of(o); /* another session's key does not open this one */
}
static void m_flags(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_PING, s, NULL, 0);
    HDR(f)->flags = 0x80;
}
static void m_replyflag(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_PING, s, NULL, 0);
    HDR(f)->flags = IPC_F_REPLY;
}
static void m_version(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_PING, s, NULL, 0);
    HDR(f)->version = IPC_VERSION + 1;
}
static void m_opcode(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, 99, s, NULL, 0);
}
static void m_bodylen(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint8_t x[8] = {0};
    frame_make(f, IPC_OP_SEQ_CLOSE, s, x, 8);
    HDR(f)->body_len = 100;
}
static void m_open_trunc(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t b[2 + 5] = {10, 0, 1, 2, 3, 4, 5}; /* announces 10 tokens, carries 5 */
    frame_make(f, IPC_OP_SEQ_OPEN, s, b, sizeof(b));
}
static void m_openp_trunc(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t b[2 + 5] = {10, 0, 1, 2, 3, 4, 5};
    frame_make(f, IPC_OP_SEQ_OPEN_PENDING, s, b, sizeof(b));
}
static void m_openp_reserved(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t b[3] = {1, 1, 7}; /* the request's reserved word set */
    frame_make(f, IPC_OP_SEQ_OPEN_PENDING, s, b, sizeof(b));
}
static void m_open_huge(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t b[3] = {IPC_MAX_TOKENS + 1, 0, 1};
    frame_make(f, IPC_OP_SEQ_OPEN, s, b, sizeof(b));
}
static void m_open_long(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    static uint32_t b[2 + 600];
    b[0] = 600; /* max_seq_len is 512 */
    for (int i = 0; i < 600; i++)
        b[2 + i] = (uint32_t)i;
    frame_make(f, IPC_OP_SEQ_OPEN, s, b, sizeof(b));
}
static void m_open_zero(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t b[2] = {0, 0};
    frame_make(f, IPC_OP_SEQ_OPEN, s, b, sizeof(b));
}
static void step_frame(frame_t *f, uint64_t s, uint32_t n_seqs, uint32_t n_tokens,
                       const uint32_t *seq_new, uint32_t flags)
{
    uint8_t b[4000];
    ipc_step_begin_req_t r = {.n_seqs = n_seqs, .n_tokens = n_tokens, .flags = flags};
    memcpy(b, &r, sizeof(r));
    if (n_seqs)
        memcpy(b + sizeof(r), seq_new, 8ull * n_seqs);
    memset(b + sizeof(r) + 8ull * n_seqs, 7, 4ull * n_tokens);
    frame_make(f, IPC_OP_STEP_BEGIN, s, b, sizeof(r) + 8ull * n_seqs + 4ull * n_tokens);
}
static void m_step_zero(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    step_frame(f, s, 0, 0, NULL, 0);
}
static void m_step_sum(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t sn[2] = {q, 3};
    step_frame(f, s, 1, 5, sn, 0);
}
static void m_step_flags(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t sn[2] = {q, 1};
    step_frame(f, s, 1, 1, sn, 4);
}
static void m_step_nonew(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t sn[4] = {q, 0, q, 1};
    step_frame(f, s, 2, 1, sn, 0);
}
static void m_step_toomany(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t sn[2] = {q, 300}; /* the session has 64 batch tokens */
    step_frame(f, s, 1, 300, sn, 0);
}
static void m_step_unknown(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t sn[2] = {q ^ 0x5a5a5, 1};
    step_frame(f, s, 1, 1, sn, 0);
}
static void m_step_dup(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t sn[4] = {q, 1, q, 1};
    step_frame(f, s, 2, 2, sn, 0);
}
static void m_close_unknown(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_seq_req_t r = {12345678, 0};
    frame_make(f, IPC_OP_SEQ_CLOSE, s, &r, sizeof(r));
}
static void m_close_other(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_seq_req_t r = {q, 0}; /* a real sequence, of another session */
    frame_make(f, IPC_OP_SEQ_CLOSE, o, &r, sizeof(r));
}
static void m_close_arg(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_seq_req_t r = {q, 5};
    frame_make(f, IPC_OP_SEQ_CLOSE, s, &r, sizeof(r));
}
static void m_trunc_range(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_seq_req_t r = {q, 100000}; /* beyond its length */
    frame_make(f, IPC_OP_SEQ_TRUNCATE, s, &r, sizeof(r));
}
static void m_session(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_PING, s ^ 0xffff, NULL, 0);
}
static void m_session_zero(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_PING, 0, NULL, 0);
}
static void m_hello_model(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.model.head_dim = 128;
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_id(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.model.model_id = 42;
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_quota(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.max_batch_tokens = 100000; /* quota 256 */
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_seqs(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.max_seqs = 9; /* quota 8 */
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_pid(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.pid = 0; /* not a process id (another one is only a claim: the kernel names the real one) */
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_pack(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.flags = 6; /* pack policy bits past PAT_PACK_TREE */
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_flags(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.flags = 0x40; /* an unknown bit */
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_kv_code(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.flags = 6u << IPC_HELLO_KV_SHIFT; /* a KV dtype past fp8_e5m2 */
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_kv_other(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.flags = (uint32_t)PAT_FP8_E4M3 << IPC_HELLO_KV_SHIFT; /* this daemon's pool is f16 */
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_label(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    memset(r.label, 'x', sizeof(r.label));
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_short(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r) - 4);
}
static void m_hello_session(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    frame_make(f, IPC_OP_HELLO, s, &r, sizeof(r));
}
static void m_hello_kind(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.buffer_kind = 7;
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_hello_cuda(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_hello_req_t r = good_hello();
    r.buffer_kind = IPC_BUF_CUDA; /* the cpu backend has no device buffers */
    frame_make(f, IPC_OP_HELLO, 0, &r, sizeof(r));
}
static void m_end_unknown(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_step_end_req_t r = {.step = 999};
    frame_make(f, IPC_OP_STEP_END, s, &r, sizeof(r));
}
static void m_end_flags(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    ipc_step_end_req_t r = {.step = 1, .flags = 6};
    frame_make(f, IPC_OP_STEP_END, s, &r, sizeof(r));
}
static void m_admin_session(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    frame_make(f, IPC_OP_STATUS, s, NULL, 0);
}
static void m_admin_body(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t x = 1;
    frame_make(f, IPC_OP_STATS, 0, &x, 4);
}
static void m_ping_body(frame_t *f, uint64_t s, uint32_t q, uint64_t o)
{
    uint32_t x = 1;
    frame_make(f, IPC_OP_PING, s, &x, 4);
}

/* Every malformed frame gets its specific answer, and costs nothing but what it names. kills:
 * a frame the daemon cannot read past (its header is not patd's, or the connection ends inside
 * it) ends its connection, and with it the session the connection belongs to; every other
 * refusal leaves the session serving, its blocks and sequences as they were. */
static const struct {
    const char *name;
    mutate_fn make;
    int code; /* the answer, or RAW_CLOSED: none, the connection closed */
    int kills;
} bad_frames[] = {
    {"frame shorter than a header", m_short, RAW_CLOSED, 0},
    {"bad magic", m_magic, -EBADMSG, 1},
    {"a key without a session", m_key_alone, -EBADMSG, 0},
    {"a session's id with a wrong key", m_key_wrong, -ENOTCONN, 0},
    {"BYE with another session's key", m_key_other, -ENOTCONN, 0},
    {"unknown flag bits", m_flags, -EBADMSG, 0},
    {"reply flag on a request", m_replyflag, -EBADMSG, 0},
    {"protocol version + 1", m_version, -EPROTONOSUPPORT, 1},
    {"unknown opcode 99", m_opcode, -EOPNOTSUPP, 0},
    {"body_len disagrees with the frame", m_bodylen, RAW_CLOSED, 1},
    {"SEQ_OPEN announces more tokens than carried", m_open_trunc, -EMSGSIZE, 0},
    {"SEQ_OPEN count beyond protocol bound", m_open_huge, -E2BIG, 0},
    {"SEQ_OPEN prompt longer than max_seq_len", m_open_long, -E2BIG, 0},
    {"SEQ_OPEN of zero tokens", m_open_zero, -EINVAL, 0},
    {"SEQ_OPEN_PENDING announces more tokens than carried", m_openp_trunc, -EMSGSIZE, 0},
    {"SEQ_OPEN_PENDING with its reserved word set", m_openp_reserved, -EBADMSG, 0},
    {"STEP_BEGIN with no sequences", m_step_zero, -EINVAL, 0},
    {"STEP_BEGIN counts do not add up", m_step_sum, -EINVAL, 0},
    {"STEP_BEGIN flags set", m_step_flags, -EBADMSG, 0},
    {"STEP_BEGIN a sequence with 0 new tokens", m_step_nonew, -EINVAL, 0},
    {"STEP_BEGIN over the session's batch tokens", m_step_toomany, -E2BIG, 0},
    {"STEP_BEGIN unknown sequence id", m_step_unknown, -ENOENT, 0},
    {"STEP_BEGIN a sequence twice", m_step_dup, -EINVAL, 0},
    {"SEQ_CLOSE unknown sequence", m_close_unknown, -ENOENT, 0},
    {"SEQ_CLOSE another session's sequence", m_close_other, -ENOENT, 0},
    {"SEQ_CLOSE with a non-zero arg", m_close_arg, -EBADMSG, 0},
    {"SEQ_TRUNCATE beyond the length", m_trunc_range, -ERANGE, 0},
    {"unknown session", m_session, -ENOTCONN, 0},
    {"session request with session 0", m_session_zero, -ENOTCONN, 0},
    {"HELLO wrong head_dim", m_hello_model, -EMEDIUMTYPE, 0},
    {"HELLO wrong model id", m_hello_id, -EMEDIUMTYPE, 0},
    {"HELLO batch tokens over quota", m_hello_quota, -EDQUOT, 0},
    {"HELLO sequences over quota", m_hello_seqs, -EDQUOT, 0},
    {"HELLO pid 0", m_hello_pid, -EINVAL, 0},
    {"HELLO label not terminated", m_hello_label, -EBADMSG, 0},
    {"HELLO pack policy 6", m_hello_pack, -EBADMSG, 0},
    {"HELLO unknown flag", m_hello_flags, -EBADMSG, 0},
    {"HELLO KV dtype 6", m_hello_kv_code, -EBADMSG, 0},
    {"HELLO needs another KV pool", m_hello_kv_other, -EMEDIUMTYPE, 0},
    {"HELLO body truncated", m_hello_short, -EMSGSIZE, 0},
    {"HELLO with a session", m_hello_session, -EINVAL, 0},
    {"HELLO unknown buffer kind", m_hello_kind, -EINVAL, 0},
    {"HELLO cuda-ipc buffers on the cpu backend", m_hello_cuda, -EINVAL, 0},
    {"STEP_END of no step", m_end_unknown, -ESRCH, 0},
    {"STEP_END unknown flags", m_end_flags, -EBADMSG, 0},
    {"admin request with a session", m_admin_session, -EINVAL, 0},
    {"admin request with a body", m_admin_body, -EMSGSIZE, 0},
    {"PING with a body", m_ping_body, -EMSGSIZE, 0},
};

static void test_malformed_frames(void **state)
{
    frame_t f;
    uint32_t ob[2 + 20] = {20, 0};
    for (int i = 0; i < 20; i++)
        ob[2 + i] = 900 + (uint32_t)i;
    const int64_t conns_before = tl_daemon_status(&D, "connections");
    for (size_t i = 0; i < sizeof(bad_frames) / sizeof(bad_frames[0]); i++) {
        /* two fresh sessions each time, one real sequence in the first */
        int s = raw_socket();
        uint64_t sess = raw_hello(s), other = raw_hello(s);
        ipc_seq_rep_t orep;
        frame_make(&f, IPC_OP_SEQ_OPEN, sess, ob, sizeof(ob));
        assert_int_equal(raw_call(s, f.b, f.len, &orep, sizeof(orep)), 0);
        frame_make(&f, IPC_OP_PING, other, NULL, 0);
        assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), 0);
        int64_t blocks_before = tl_daemon_status(&D, "blocks_used");
        int64_t seqs_before = tl_daemon_status(&D, "sequences");
        bad_frames[i].make(&f, sess, orep.seq, other);
        int code = raw_call(s, f.b, f.len, NULL, 0);
        if (code != bad_frames[i].code)
            fail_msg("%s: got %d (%s), want %d (%s)", bad_frames[i].name, code,
                     ipc_err_name(code) ? ipc_err_name(code) : "?", bad_frames[i].code,
                     ipc_err_name(bad_frames[i].code) ? ipc_err_name(bad_frames[i].code) : "?");
        /* the other session is untouched and the daemon serves */
        frame_make(&f, IPC_OP_PING, other, NULL, 0);
        assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), 0);
        assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
        frame_make(&f, IPC_OP_PING, sess, NULL, 0);
        if (bad_frames[i].kills) {
            /* the session went with its connection: everything it held is back */
            for (int t = 0; t < 100 && tl_daemon_status(&D, "sequences") != seqs_before - 1; t++)
                usleep(10000);
            assert_int_equal(tl_daemon_status(&D, "sequences"), seqs_before - 1);
            assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), -ENOTCONN);
        } else {
            if (raw_call(s, f.b, f.len, NULL, 0) != 0)
                fail_msg("%s: the session no longer serves", bad_frames[i].name);
            assert_int_equal(tl_daemon_status(&D, "blocks_used"), blocks_before);
            assert_int_equal(tl_daemon_status(&D, "sequences"), seqs_before);
            frame_make(&f, IPC_OP_BYE, sess, NULL, 0);
            assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), 0);
        }
        frame_make(&f, IPC_OP_BYE, other, NULL, 0);
        assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), 0);
        close(s);
        for (int t = 0; t < 100 && tl_daemon_status(&D, "connections") != conns_before; t++)
            usleep(10000);
        assert_int_equal(tl_daemon_status(&D, "connections"), conns_before);
        assert_int_equal(tl_daemon_status(&D, "blocks_used"), 0);
    }
    /* refusals are counted by code */
    assert_true(tl_daemon_metric(&D, "patd_errors_total{code=\"BAD_MAGIC\"}") >= 5);
    /* a resent request (same correlation id) is answered again, applied once */
    int s = raw_socket();
    uint64_t sess = raw_hello(s);
    ipc_seq_rep_t orep;
    frame_make(&f, IPC_OP_SEQ_OPEN, sess, ob, sizeof(ob));
    assert_int_equal(raw_call(s, f.b, f.len, &orep, sizeof(orep)), 0);
    int64_t seqs_before = tl_daemon_status(&D, "sequences");
    ipc_seq_req_t fr = {orep.seq, 0};
    ipc_seq_rep_t child1, child2;
    frame_make(&f, IPC_OP_SEQ_FORK, sess, &fr, sizeof(fr));
    HDR(&f)->corr = 4242;
    assert_int_equal(raw_call(s, f.b, f.len, &child1, sizeof(child1)), 0);
    assert_int_equal(raw_call(s, f.b, f.len, &child2, sizeof(child2)), 0);
    assert_int_equal(child1.seq, child2.seq);
    assert_int_equal(tl_daemon_status(&D, "sequences"), seqs_before + 1);
    frame_make(&f, IPC_OP_BYE, sess, NULL, 0);
    assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), 0);
    assert_int_equal(tl_daemon_status(&D, "sequences"), 0);
    assert_int_equal(tl_daemon_status(&D, "blocks_used"), 0);
    assert_int_equal(tl_daemon_status(&D, "connections"), 0);
    close(s);
}

/* ---------------------------------------------------------------- through libpat */
static pat_conn_t *connect_ok(uint32_t max_seqs)
{
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 256,
                            .max_seqs = max_seqs,
                            .timeout_ms = 10000,
                            .socket = D.sock,
                            .label = "proto",
                            .model = MODEL};
    pat_conn_t *c = NULL;
    char why[256];
    int rc = pat_connect(&o, &c, why, sizeof(why));
    if (rc < 0)
        fail_msg("connect: %s: %s", pat_strerror(rc), why);
    return c;
}

/* pat_strerror says what each code means from every public call that documents it (pat.h):
 * one row per (call, code), the word its text must hold; and the texts of real returns */
static void test_strerror_table(void **state)
{
    (void)state;
    static const struct {
        const char *call;
        int code;
        const char *word;
    } rows[] = {
        {"pat_connect", -ENOENT, "no daemon"},
        {"pat_connect", -ECONNREFUSED, "stale socket"},
        {"pat_connect", -ETIMEDOUT, "timed out"},
        {"pat_connect", -EMEDIUMTYPE, "model"},
        {"pat_connect", -EDQUOT, "quota"},
        {"pat_connect", -EMFILE, "too many"},
        {"pat_connect", -ENOBUFS, "staging budget exhausted (limits.staging_mb)"},
        {"pat_connect", -ENOMEM, "memory"},
        {"pat_connect", -ESHUTDOWN, "draining"},
        {"pat_connect", -EINVAL, "invalid"},
        {"pat_seq_open", -EMFILE, "sequences"},
        {"pat_seq_open_pending", -EMFILE, "sequences"},
        {"pat_seq_close", -ENOENT, "sequence id"},
        {"pat_step_begin", -E2BIG, "exceeds"},
        {"pat_step_begin", -EBUSY, "step"},
        {"pat_attend", -ENOSPC, "out of blocks"},
        {"pat_attend", -EDQUOT, "quota"},
        {"pat_attend", -ENOENT, "sequence id"},
        {"pat_attend", -ETIMEDOUT, "layer"},
        {"pat_attend", -ECANCELED, "aborted"},
        {"pat_attend", -ESHUTDOWN, "shutting down"},
        {"pat_attend", -ECONNRESET, "went away"},
        {"pat_attend_async", -ESRCH, "no step"},
        {"pat_attend_async", -EIO, "CUDA"},
        {"pat_attend_async", -ENOTSUP, "host-memory session"},
        {"pat_step_replayed", -ESRCH, "no step"},
        {"pat_admin", -EPERM, "admin_group"},
        {"pat_admin", -ECONNREFUSED, "stale socket"},
        {"pat_status", -ENOENT, "no daemon"},
        {"pat_status", -ECONNREFUSED, "stale socket"},
        {"pat_status", -EOPNOTSUPP, "older release"},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const char *t = pat_strerror(rows[i].code);
        if (!strstr(t, rows[i].word))
            fail_msg("%s's %d: pat_strerror says \"%s\", no \"%s\"", rows[i].call, rows[i].code, t,
                     rows[i].word);
        assert_string_equal(pat_strerror(-rows[i].code), t); /* either sign */
    }
    /* real returns: no daemon at a path, an id this session does not hold */
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 64,
                            .timeout_ms = 2000,
                            .socket = "/nonexistent/patd.sock",
                            .model = MODEL};
    pat_conn_t *c = NULL;
    char why[256];
    int rc = pat_connect(&o, &c, why, sizeof(why));
    assert_int_equal(rc, -ENOENT);
    assert_non_null(strstr(pat_strerror(rc), "no daemon"));
    c = connect_ok(4);
    rc = pat_seq_close(c, 12345);
    assert_int_equal(rc, -ENOENT);
    assert_non_null(strstr(pat_strerror(rc), "sequence id"));
    pat_close(c);
}

/* Twins in two sessions of one user: a prompt opened while another session's sequence is about
 * to write its full blocks reports them as pending (pat_seq_open_pending), nothing cached; once
 * that sequence commits them they are cached, nothing pending, and a step over them checks
 * clean against float64. SEQ_OPEN's reply keeps its 8 bytes. */
static void test_pending_twins(void **state)
{
    (void)state;
    pat_conn_t *a = connect_ok(4), *b = connect_ok(4);
    tl_rng_t rng;
    tl_rng_seed(&rng, 11);
    tl_seq_t first;
    tl_seq_init(&first);
    uint32_t tok[40];
    for (uint32_t t = 0; t < 40; t++) {
        tok[t] = 9000 + t;
        tl_seq_push(&first, tok[t]);
    }
    assert_int_equal(tl_seq_open(a, &first), 0); /* about to write blocks 0 and 1 */
    uint32_t seq, cached = 99, pending = 99;
    assert_int_equal(pat_seq_open_pending(b, tok, 40, &seq, &cached, &pending), 0);
    assert_int_equal(cached, 0);
    assert_int_equal(pending, 32);              /* (40 - 1) / 16 = 2 eligible blocks */
    assert_int_equal(pat_seq_close(b, seq), 0); /* a frontend that waits */
    tl_seq_t *ps[1] = {&first};
    tl_step_result_t r;
    assert_int_equal(tl_client_step(a, &MODEL, ps, 1, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    tl_seq_t twin;
    tl_seq_init(&twin);
    for (uint32_t t = 0; t < 40; t++)
        tl_seq_push(&twin, tok[t]);
    assert_int_equal(pat_seq_open_pending(b, tok, 40, &twin.seq, &cached, &pending), 0);
    assert_int_equal(cached, 32);
    assert_int_equal(pending, 0);
    twin.cached = twin.len = cached;
    ps[0] = &twin;
    assert_int_equal(tl_client_step(b, &MODEL, ps, 1, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    /* SEQ_OPEN, raw: an 8-byte reply as before 1.7 */
    int s = raw_socket();
    const uint64_t session = raw_hello(s);
    frame_t f;
    uint32_t body[2 + 40] = {40, 0};
    memcpy(body + 2, tok, sizeof(tok));
    ipc_seq_rep_t old;
    frame_make(&f, IPC_OP_SEQ_OPEN, session, body, sizeof(body));
    assert_int_equal(raw_call(s, f.b, f.len, &old, sizeof(old)), 0);
    assert_int_equal(old.len, 32);
    frame_make(&f, IPC_OP_BYE, session, NULL, 0);
    assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), 0);
    close(s);
    tl_seq_done(&first);
    tl_seq_done(&twin);
    pat_close(a);
    pat_close(b);
}

static void test_connect_refusals(void **state)
{
    pat_connect_opts_t o = {
        .size = sizeof(o), .max_batch_tokens = 64, .socket = D.sock, .model = MODEL};
    pat_conn_t *c = NULL;
    char why[256];
    o.model.kv_heads = 4;
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), -EMEDIUMTYPE);
    assert_non_null(strstr(why, "model signature mismatch"));
    assert_null(c);
    o.model = MODEL;
    o.max_batch_tokens = 100000;
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), -EDQUOT);
    o.max_batch_tokens = 64;
    o.socket = "/nonexistent/patd.sock";
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), -ENOENT);
    assert_non_null(strstr(why, "cannot reach patd"));
    o.size = 0;
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), -EINVAL);
    assert_string_equal(pat_strerror(-EMEDIUMTYPE), "model signature does not match the daemon's");
    /* a label that would forge a log line (newline + a syslog priority) is refused */
    o.size = sizeof(o);
    o.socket = D.sock;
    o.label = "x\n<0>patd: emergency";
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), -EINVAL);
    assert_null(c);
    o.label = NULL;
    /* options out of range are refused before a socket is opened: none is left behind (the
     * buffer check once returned with the daemon's socket still open) */
    const int fds0 = tl_open_fds();
    for (int i = 0; i < 8; i++) {
        o.buffer = PAT_BUFFER_GPU + 1;
        assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), -EINVAL);
        assert_non_null(strstr(why, "opts.buffer"));
        o.buffer = PAT_BUFFER_AUTO;
        o.pack_policy = PAT_PACK_TREE + 1;
        assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), -EINVAL);
        assert_non_null(strstr(why, "opts.pack_policy"));
        o.pack_policy = 0;
        assert_null(c);
    }
    assert_int_equal(tl_open_fds(), fds0);
}

/* Hostile HELLO fields and resends: a lease asked far beyond limits.max_lease_ms is cut to it
 * (a session that never pings cannot pin its resources for days); a frame that reuses the
 * correlation id of the previous request under another opcode is a new request, not a resend. */
static void test_hello_bounds_and_resends(void **state)
{
    int s = raw_socket();
    frame_t f;
    ipc_hello_req_t r = good_hello();
    r.lease_ms = 0xffffffffu;
    ipc_hello_rep_t rep;
    frame_make(&f, IPC_OP_HELLO, 0, &r, sizeof(r));
    assert_int_equal(raw_call(s, f.b, f.len, &rep, sizeof(rep)), 0);
    assert_int_equal(rep.lease_ms, 60000); /* the default limits.max_lease_ms */
    /* PING, then SEQ_CLOSE of an unknown sequence with the PING's correlation id */
    frame_make(&f, IPC_OP_PING, rep.session, NULL, 0);
    assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), 0);
    uint64_t corr = HDR(&f)->corr;
    ipc_seq_req_t q = {123456, 0};
    frame_make(&f, IPC_OP_SEQ_CLOSE, rep.session, &q, sizeof(q));
    HDR(&f)->corr = corr;
    assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), -ENOENT);
    /* a real resend (same id, same opcode) still gets the kept answer */
    assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), -ENOENT);
    /* what others can see says nothing of a session's id: the ids are not a counter, the
     * staging buffer's name and SEQS do not show them */
    ipc_hello_rep_t rep2;
    r.lease_ms = 0;
    frame_make(&f, IPC_OP_HELLO, 0, &r, sizeof(r));
    assert_int_equal(raw_call(s, f.b, f.len, &rep2, sizeof(rep2)), 0);
    assert_true(rep2.session >> 32 == rep.session >> 32); /* the same instance */
    assert_true((uint32_t)rep2.session != (uint32_t)rep.session + 1);
    char hex[2][24];
    snprintf(hex[0], sizeof(hex[0]), "%016llx", (unsigned long long)rep.session);
    snprintf(hex[1], sizeof(hex[1]), "%016llx", (unsigned long long)rep2.session);
    uint32_t ob[2 + 1] = {1, 0, 77};
    frame_make(&f, IPC_OP_SEQ_OPEN, rep2.session, ob, sizeof(ob));
    ipc_seq_rep_t orep;
    assert_int_equal(raw_call(s, f.b, f.len, &orep, sizeof(orep)), 0);
    char *seqs = NULL;
    assert_int_equal(pat_admin(D.sock, PAT_ADMIN_SEQS, 2000, &seqs), 0);
    for (int i = 0; i < 2; i++) {
        assert_null(strstr(seqs, hex[i]));
        assert_null(strstr(rep.shm_name, hex[i]));
        assert_null(strstr(rep2.shm_name, hex[i]));
    }
    char line[64]; /* the sequence is listed, by its session's label and its own id */
    snprintf(line, sizeof(line), " raw %u ", orep.seq);
    assert_non_null(strstr(seqs, line));
    pat_free(seqs);
    uint64_t sess[2] = {rep.session, rep2.session};
    for (int i = 0; i < 2; i++) {
        frame_make(&f, IPC_OP_BYE, sess[i], NULL, 0);
        assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), 0);
    }
    close(s);
}

static void test_sequences_and_quotas(void **state)
{
    pat_conn_t *c = connect_ok(4);
    tl_rng_t rng;
    tl_rng_seed(&rng, 5);
    tl_seq_t s[5];
    tl_seq_t *ps[4];
    for (int i = 0; i < 4; i++) {
        tl_seq_init(&s[i]);
        for (uint32_t t = 0; t < 40; t++)
            tl_seq_push(&s[i], 10 + t + (i == 3 ? 1000u : 0u));
        assert_int_equal(tl_seq_open(c, &s[i]), 0);
        ps[i] = &s[i];
    }
    /* the 5th sequence is over the session's quota of 4 */
    tl_seq_init(&s[4]);
    tl_seq_push(&s[4], 1);
    assert_int_equal(tl_seq_open(c, &s[4]), -EDQUOT);
    /* prefill one (the others share its prompt only once it is committed) */
    tl_step_result_t r;
    assert_int_equal(tl_client_step(c, &MODEL, ps, 1, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    /* a sequence opened now finds the 2 full blocks of the committed prompt */
    pat_seq_close(c, s[1].seq);
    tl_seq_t again;
    tl_seq_init(&again);
    for (uint32_t t = 0; t < 40; t++)
        tl_seq_push(&again, 10 + t);
    assert_int_equal(tl_seq_open(c, &again), 0);
    assert_int_equal(again.cached, 32);
    /* and computes only the rest, checked against the full logical KV */
    ps[1] = &again;
    assert_int_equal(tl_client_step(c, &MODEL, ps + 1, 2, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    /* decode, fork, truncate (speculative rollback), decode again: all checked */
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 3; i++)
            tl_seq_push(ps[i], 500 + (uint32_t)k);
        assert_int_equal(tl_client_step(c, &MODEL, ps, 3, &rng, 1, &r), 0);
        assert_true(r.worst < 1e-2);
    }
    assert_int_equal(pat_seq_fork(c, ps[0]->seq, &s[4].seq), -EDQUOT); /* 4 open */
    assert_int_equal(pat_seq_close(c, s[3].seq), 0);
    tl_seq_t child;
    tl_seq_init(&child);
    for (uint32_t t = 0; t < ps[0]->n_tok; t++)
        tl_seq_push(&child, ps[0]->tok[t]);
    child.len = ps[0]->len;
    assert_int_equal(pat_seq_fork(c, ps[0]->seq, &child.seq), 0);
    assert_int_equal(pat_seq_truncate(c, ps[2]->seq, 30), 0);
    ps[2]->len = 30;
    ps[2]->n_tok = 31; /* re-decode token 30 */
    assert_int_equal(pat_seq_truncate(c, ps[2]->seq, 31), -ERANGE);
    ps[3] = &child;
    tl_seq_push(&child, 77);
    tl_seq_push(ps[0], 78);
    tl_seq_push(ps[1], 79);
    assert_int_equal(tl_client_step(c, &MODEL, ps, 4, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    /* a sequence in the step in flight cannot be closed; the step cannot start twice */
    uint32_t sid = ps[0]->seq, one = 1, tk = 5;
    tl_seq_push(ps[0], 5);
    assert_int_equal(pat_step_begin(c, &sid, &one, 1, &tk), 0);
    assert_int_equal(pat_step_begin(c, &sid, &one, 1, &tk), -EBUSY);
    assert_int_equal(pat_seq_close(c, sid), -EBUSY);
    assert_int_equal(pat_attend(c, 1), -EINVAL); /* layers go in order */
    pat_step_info_t info;
    assert_int_equal(pat_step_end(c, 1, &info), 0); /* abort: nothing committed */
    assert_int_equal(info.committed, 0);
    /* the aborted token is not in the sequence: decoding a different one checks clean */
    ps[0]->n_tok--;
    tl_seq_push(ps[0], 6);
    assert_int_equal(tl_client_step(c, &MODEL, ps, 1, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    pat_close(c);
    for (int i = 0; i < 5; i++)
        tl_seq_done(&s[i]);
    tl_seq_done(&again);
    tl_seq_done(&child);
    assert_int_equal(tl_daemon_status(&D, "sequences"), 0);
    assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
}

/* Chunked prefill up to the session's block quota (64 blocks = 1024 tokens), then over it. */
static void test_block_quota(void **state)
{
    pat_conn_t *c = connect_ok(4);
    tl_rng_t rng;
    tl_rng_seed(&rng, 9);
    tl_seq_t s[3];
    tl_seq_t *one[1];
    tl_step_result_t r;
    for (int i = 0; i < 3; i++) {
        tl_seq_init(&s[i]);
        for (uint32_t t = 0; t < 256; t++)
            tl_seq_push(&s[i], 7000 * (uint32_t)(i + 1) + t);
        assert_int_equal(tl_seq_open(c, &s[i]), 0);
        one[0] = &s[i];
        int rc = tl_client_step(c, &MODEL, one, 1, &rng, 0, &r); /* 16 blocks */
        if (i < 2) {
            assert_int_equal(rc, 0);
            for (uint32_t t = 0; t < 256; t++) /* second chunk: 32 blocks in all */
                tl_seq_push(&s[i], 7000 * (uint32_t)(i + 1) + 256 + t);
            assert_int_equal(tl_client_step(c, &MODEL, one, 1, &rng, 0, &r), 0);
        } else {
            assert_int_equal(rc, -EDQUOT); /* 64 held, 16 more asked */
            assert_non_null(strstr(pat_last_error(c), "quota"));
        }
    }
    /* nothing was half-applied: the refused sequence is still empty and usable later */
    assert_int_equal(pat_seq_close(c, s[0].seq), 0);
    one[0] = &s[2];
    assert_int_equal(tl_client_step(c, &MODEL, one, 1, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    pat_close(c);
    for (int i = 0; i < 3; i++)
        tl_seq_done(&s[i]);
    assert_int_equal(tl_daemon_status(&D, "blocks_used"), 0);
    assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
}

/* The quota counts distinct blocks: sequences that reuse one committed prompt, and forks of it,
 * hold its 30 blocks once. Six sequences over a 480-token prompt name 186 blocks in their tables
 * but hold 36, within the session's 64 (counted per table entry, the third one's open passed 64
 * and the step that followed was refused); a seventh with a prompt of its own still meets it. */
static void test_block_quota_shared(void **state)
{
    pat_conn_t *c = connect_ok(8);
    tl_rng_t rng;
    tl_rng_seed(&rng, 10);
    tl_step_result_t r;
    tl_seq_t s[7];
    tl_seq_t *ps[6];
    for (int i = 0; i < 7; i++)
        tl_seq_init(&s[i]);
    for (int i = 0; i < 6; i++)
        ps[i] = &s[i];
    /* the prompt, prefilled in two chunks of 240 (the session's batch is 256) and so published */
    for (uint32_t t = 0; t < 240; t++)
        tl_seq_push(&s[0], 9000 + t);
    assert_int_equal(tl_seq_open(c, &s[0]), 0);
    assert_int_equal(tl_client_step(c, &MODEL, ps, 1, &rng, 0, &r), 0);
    for (uint32_t t = 240; t < 480; t++)
        tl_seq_push(&s[0], 9000 + t);
    assert_int_equal(tl_client_step(c, &MODEL, ps, 1, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    /* three more requests with the same prompt and a token of their own: 30 blocks reused */
    for (int i = 1; i < 4; i++) {
        for (uint32_t t = 0; t < 480; t++)
            tl_seq_push(&s[i], 9000 + t);
        tl_seq_push(&s[i], 100 + (uint32_t)i);
        assert_int_equal(tl_seq_open(c, &s[i]), 0);
        assert_int_equal(s[i].cached, 480);
    }
    assert_int_equal(tl_client_step(c, &MODEL, ps + 1, 3, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    /* two forks of the prompt (block-aligned: nothing copied) */
    for (int i = 4; i < 6; i++) {
        for (uint32_t t = 0; t < s[0].n_tok; t++)
            tl_seq_push(&s[i], s[0].tok[t]);
        s[i].len = s[0].len;
        assert_int_equal(pat_seq_fork(c, s[0].seq, &s[i].seq), 0);
    }
    /* a decode step of all six: a block more for s[0] and each fork, checked */
    for (int i = 0; i < 6; i++)
        tl_seq_push(&s[i], 300 + (uint32_t)i);
    assert_int_equal(tl_client_step(c, &MODEL, ps, 6, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    /* private blocks still count: 36 held, 16 more fit, 15 after them do not */
    tl_seq_t *one[1] = {&s[6]};
    for (uint32_t t = 0; t < 256; t++)
        tl_seq_push(&s[6], 30000 + t);
    assert_int_equal(tl_seq_open(c, &s[6]), 0);
    assert_int_equal(tl_client_step(c, &MODEL, one, 1, &rng, 0, &r), 0);
    for (uint32_t t = 256; t < 496; t++)
        tl_seq_push(&s[6], 30000 + t);
    assert_int_equal(tl_client_step(c, &MODEL, one, 1, &rng, 0, &r), -EDQUOT);
    assert_non_null(strstr(pat_last_error(c), "quota"));
    pat_close(c);
    for (int i = 0; i < 7; i++)
        tl_seq_done(&s[i]);
    assert_int_equal(tl_daemon_status(&D, "blocks_used"), 0);
    assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
}

/* A session with one open sequence on its own socket, and a STEP_BEGIN frame for it. */
typedef struct raw_sess {
    int sock;
    uint64_t id;
    uint32_t seq;
    uint64_t step;
} raw_sess_t;

static raw_sess_t raw_session(void)
{
    raw_sess_t r = {.sock = raw_socket()};
    r.id = raw_hello(r.sock);
    frame_t f;
    uint32_t ob[2 + 4] = {4, 0, 11, 12, 13, 14};
    ipc_seq_rep_t orep;
    frame_make(&f, IPC_OP_SEQ_OPEN, r.id, ob, sizeof(ob));
    assert_int_equal(raw_call(r.sock, f.b, f.len, &orep, sizeof(orep)), 0);
    r.seq = orep.seq;
    return r;
}

static void begin_frame(frame_t *f, raw_sess_t *r)
{
    struct {
        ipc_step_begin_req_t b;
        ipc_step_seq_t q;
        uint32_t tok[4];
    } __attribute__((packed)) body = {{1, 4, 0, 0}, {r->seq, 4}, {11, 12, 13, 14}};
    frame_make(f, IPC_OP_STEP_BEGIN, r->id, &body, sizeof(body));
    r->step++;
}

static void end_frame(frame_t *f, const raw_sess_t *r)
{
    ipc_step_end_req_t end = {r->step, IPC_STEP_END_ABORT, 0};
    frame_make(f, IPC_OP_STEP_END, r->id, &end, sizeof(end));
}

/* STEP_END(abort) sent right behind its STEP_BEGIN, while the BEGIN is still unanswered and the
 * step queued (both executors hold other sessions' steps, which wait for hand-overs that never
 * come): both requests get an answer, in order, once an executor is free. The daemon once
 * answered the BEGIN of the cpu step that never started and dropped the END that stopped it.
 * (Since protocol 8 a session's requests share one connection, read one at a time: the END
 * waits in the socket until the BEGIN is answered.) */
static void test_end_before_begin_answered(void **state)
{
    raw_sess_t busy[2] = {raw_session(), raw_session()}, me = raw_session();
    const int me_fd = sess_fd(me.id);
    frame_t f;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 2; i++) { /* both executors: a step waiting for layer 0 */
            begin_frame(&f, &busy[i]);
            ipc_step_begin_rep_t rep;
            assert_int_equal(raw_call(busy[i].sock, f.b, f.len, &rep, sizeof(rep)), 0);
        }
        begin_frame(&f, &me);
        assert_int_equal(tl_wire_send(me_fd, f.b, f.len), 0);
        end_frame(&f, &me);
        assert_int_equal(tl_wire_send(me_fd, f.b, f.len), 0);
        usleep(100000);               /* the BEGIN is read while the step is queued */
        for (int i = 0; i < 2; i++) { /* free the executors */
            end_frame(&f, &busy[i]);
            ipc_step_end_rep_t rep;
            assert_int_equal(raw_call(busy[i].sock, f.b, f.len, &rep, sizeof(rep)), 0);
            assert_int_equal(rep.committed, 0);
        }
        static const uint16_t order[2] = {IPC_OP_STEP_BEGIN, IPC_OP_STEP_END};
        for (int k = 0; k < 2; k++) {
            void *msg = NULL;
            int n = tl_wire_recv(me_fd, &msg); /* 3 s timeout (tl_wire_open) */
            if (n < (int)sizeof(ipc_hdr_t))
                fail_msg("round %d: no answer to %s", round, k ? "STEP_END" : "STEP_BEGIN");
            ipc_hdr_t h;
            assert_int_equal(ipc_frame_check(msg, (size_t)n, 1, &h), 0);
            assert_int_equal(h.opcode, order[k]);
            free(msg);
        }
    }
    raw_sess_t *all[3] = {&busy[0], &busy[1], &me};
    for (int i = 0; i < 3; i++) {
        frame_make(&f, IPC_OP_BYE, all[i]->id, NULL, 0);
        assert_int_equal(raw_call(all[i]->sock, f.b, f.len, NULL, 0), 0);
        close(all[i]->sock);
    }
    assert_int_equal(tl_daemon_status(&D, "blocks_used"), 0);
    assert_int_equal(tl_daemon_status(&D, "pool_check"), 0);
}

/* HELLO is served on the admin socket only (protocol 5): on the control socket it is refused,
 * ATTACH is retired; on the admin socket the session is bound to the caller whatever pid it
 * claims (its pid is watched: it steps at once), and its staging buffer comes beside the reply,
 * a sealed memfd its client can neither shrink nor grow. */
static void test_hello_admin(void **state)
{
    int s = raw_socket();
    frame_t f;
    ipc_hello_req_t r = good_hello();
    r.pid = 1; /* a claim the daemon does not act on */
    frame_make(&f, IPC_OP_HELLO, 0, &r, sizeof(r));
    /* served where the kernel names the caller, not on the control socket: refused there, and
     * that connection closed */
    assert_int_equal(tl_wire_send(s, f.b, f.len), 0);
    void *msg = NULL;
    int n = tl_wire_recv(s, &msg);
    assert_true(n == (int)(sizeof(ipc_hdr_t) + sizeof(ipc_err_body_t)));
    ipc_err_body_t e;
    memcpy(&e, (uint8_t *)msg + sizeof(ipc_hdr_t), sizeof(e));
    assert_int_equal(e.code, -EPERM);
    free(msg);
    assert_int_equal(tl_wire_recv(s, &msg), 0);
    close(s);
    s = raw_socket();
    ipc_hello_rep_t rep;
    int fd = -1;
    assert_int_equal(raw_admin(f.b, f.len, &rep, sizeof(rep), &fd), 0);
    assert_true(fd >= 0);
    assert_int_equal(rep.shm_name[0], 0); /* no name anyone could open */
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal((uint64_t)st.st_size, rep.buf_bytes);
    assert_int_equal(ftruncate(fd, 4096), -1); /* sealed: the daemon's mapping stays whole */
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(fd, (off_t)rep.buf_bytes * 2), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(fcntl(fd, F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW),
                     F_SEAL_SHRINK | F_SEAL_GROW);
    close(fd);
    /* ATTACH is retired, on either socket */
    frame_make(&f, IPC_OP_ATTACH, rep.session, NULL, 0);
    assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), -EOPNOTSUPP);
    assert_int_equal(raw_admin(f.b, f.len, NULL, 0, NULL), -EOPNOTSUPP);
    /* bound to this process (pid 1 was only claimed): a step begins at once */
    uint32_t ob[2 + 1] = {1, 0, 77};
    frame_make(&f, IPC_OP_SEQ_OPEN, rep.session, ob, sizeof(ob));
    ipc_seq_rep_t orep;
    assert_int_equal(raw_call(s, f.b, f.len, &orep, sizeof(orep)), 0);
    const uint32_t sn[2] = {orep.seq, 1};
    step_frame(&f, rep.session, 1, 1, sn, 0);
    ipc_step_begin_rep_t brep;
    assert_int_equal(raw_call(s, f.b, f.len, &brep, sizeof(brep)), 0);
    ipc_step_end_req_t er = {.step = brep.step, .flags = IPC_STEP_END_ABORT};
    frame_make(&f, IPC_OP_STEP_END, rep.session, &er, sizeof(er));
    assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), 0);
    /* the admin socket's own refusals: a HELLO body of the wrong length, and a body on an
     * admin request that has none */
    frame_make(&f, IPC_OP_HELLO, 0, &r, sizeof(r) - 8);
    assert_int_equal(raw_admin(f.b, f.len, NULL, 0, NULL), -EMSGSIZE);
    uint32_t x = 1;
    frame_make(&f, IPC_OP_STATUS, 0, &x, sizeof(x));
    assert_int_equal(raw_admin(f.b, f.len, NULL, 0, NULL), -EMSGSIZE);
    frame_make(&f, IPC_OP_BYE, rep.session, NULL, 0);
    assert_int_equal(raw_call(s, f.b, f.len, NULL, 0), 0);
    close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_frames),
        cmocka_unit_test(test_connect_refusals),
        cmocka_unit_test(test_sequences_and_quotas),
        cmocka_unit_test(test_pending_twins),
        cmocka_unit_test(test_block_quota),
        cmocka_unit_test(test_block_quota_shared),
        cmocka_unit_test(test_end_before_begin_answered),
        cmocka_unit_test(test_hello_bounds_and_resends),
        cmocka_unit_test(test_hello_admin),
        cmocka_unit_test(test_strerror_table),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
