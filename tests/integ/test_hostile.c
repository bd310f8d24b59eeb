/*
 * test_hostile.c — what a hostile member of the socket group (or any local user) can do to patd
 * through its sockets, each with a checked bystander beside it (a session stepping against a
 * float64 reference before and after):
 *   - descriptors passed with SCM_RIGHTS on .sock, .events and .admin, with and without a
 *     nanomsg SP header first (libnanomsg kept every one but the first of each message, and an
 *     SP message type other than 1 aborted it): the daemon's descriptor count and shared memory
 *     stay flat, it stays alive;
 *   - 20,000 bare connections (no session) on .sock and .events: bounded, the oldest idle
 *     ones make room, STATUS and a new session still get in, the daemon does not spin;
 *   - the event stream: another user's subscriber sees none of a user's blocks (their hashes
 *     would confirm a guessed prompt), the user's own subscriber and an admin see them;
 *   - a STEP_BEGIN followed at once by BYE, or by the connection's end, 1,000 times: every
 *     request is answered, nothing is left behind.
 * Real patd processes (tl_daemon), real clients (libpat) and raw frames (tl_wire).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ipc_proto.h"
#include "pat.h"
#include "pat_base.h"
#include "tl_client.h"
#include "tl_daemon.h"
#include "tl_wire.h"

static const pat_model_t MODEL = {4, 8, 2, 64, PAT_F16, 16, 0};

/* ---------------------------------------------------------------- the daemon from outside */
static int fd_count(pid_t pid)
{
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "ls /proc/%d/fd | wc -l", (int)pid);
    FILE *f = popen(cmd, "r");
    int n = -1;
    if (f && fscanf(f, "%d", &n) != 1)
        n = -1;
    if (f)
        pclose(f);
    return n;
}

/* kB of a /proc/<pid>/status line (RssShmem, VmRSS) */
static long status_kb(pid_t pid, const char *key)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, key, strlen(key)) && line[strlen(key)] == ':')
            v = strtol(line + strlen(key) + 1, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

/* CPU time (user + system) in clock ticks */
static long cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    long ut = -1, st = -1;
    if (f && fgets(buf, sizeof(buf), f)) {
        char *p = strrchr(buf, ')'); /* after the command name, fields 3.. */
        if (p &&
            sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &st) != 2)
            ut = st = -1;
    }
    if (f)
        fclose(f);
    return ut < 0 ? -1 : ut + st;
}

static void sleep_ms(unsigned ms)
{
    usleep(ms * 1000u);
}

static void path_of(const tl_daemon_t *d, const char *ext, char *out, size_t len)
{
    size_t n = strlen(d->sock);
    snprintf(out, len, "%.*s.%s", (int)(n - 5), d->sock, ext);
}

/* ---------------------------------------------------------------- a checked bystander */
static pat_conn_t *connect_to(const tl_daemon_t *d, const char *label)
{
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 256,
                            .max_seqs = 8,
                            .timeout_ms = 10000,
                            .socket = d->sock,
                            .label = label,
                            .model = MODEL};
    pat_conn_t *c = NULL;
    char why[256];
    int rc = pat_connect(&o, &c, why, sizeof(why));
    if (rc < 0)
        fail_msg("connect %s: %s: %s", label, pat_strerror(rc), why);
    return c;
}

typedef tl_bystander_t bystander_t;

static void by_open(bystander_t *b, const tl_daemon_t *d, uint32_t base)
{
    char why[256];
    if (tl_by_open(b, d->sock, &MODEL, base, why, sizeof(why)) < 0)
        fail_msg("%s", why);
}

static void by_step(bystander_t *b)
{
    char why[256];
    if (tl_by_step(b, why, sizeof(why)) < 0)
        fail_msg("%s", why);
}

static void by_close(bystander_t *b)
{
    tl_by_close(b);
}

/* ---------------------------------------------------------------- descriptors */
/* A memfd holding `bytes` of real pages: what would pin memory inside the daemon if it kept it. */
static int full_memfd(size_t bytes)
{
    int fd = memfd_create("hostile", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(p != MAP_FAILED);
    memset(p, 0x5a, bytes);
    munmap(p, bytes);
    return fd;
}

/* Sends buf with n descriptors attached; the send's result (the daemon may have closed). */
static ssize_t send_fds(int s, const void *buf, size_t len, const int *fds, int n)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(8 * sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec iov = {(void *)buf, len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n) {
        m.msg_control = ctl.b;
        m.msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
        memcpy(CMSG_DATA(c), fds, (size_t)n * sizeof(int));
    }
    return sendmsg(s, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static int raw_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(s);
        return -1;
    }
    return s;
}

/* 400 connections on each socket, each with 8 messages of 3 descriptors (4 MiB memfds), after an
 * SP header, a patd header, or nothing; and the 13-byte message that aborted libnanomsg. */
static void test_fd_injection(void **state)
{
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, NULL), 0);
    bystander_t b;
    by_open(&b, &d, 3000);
    by_step(&b);
    sleep_ms(200);
    const int fds0 = fd_count(d.pid);
    const long shm0 = status_kb(d.pid, "RssShmem");
    int mf[3];
    for (int i = 0; i < 3; i++)
        mf[i] = full_memfd(4u << 20);
    char paths[3][200];
    path_of(&d, "sock", paths[0], sizeof(paths[0]));
    path_of(&d, "events", paths[1], sizeof(paths[1]));
    path_of(&d, "admin", paths[2], sizeof(paths[2]));
    /* nanomsg's SP header of a REQ peer, then an ipc message whose type byte is 0 */
    static const uint8_t sp[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
    static const uint8_t bad_msg[5] = {0, 0, 0, 0, 0};
    ipc_hdr_t h = {.magic = IPC_MAGIC, .version = IPC_VERSION, .opcode = IPC_OP_STATUS, .corr = 1};
    for (int p = 0; p < 3; p++)
        for (int i = 0; i < 400; i++) {
            int s = raw_connect(paths[p]);
            if (s < 0)
                continue;
            switch (i % 3) {
            case 0:
                send_fds(s, sp, sizeof(sp), mf, 3);
                send_fds(s, bad_msg, sizeof(bad_msg), mf, 3);
                break;
            case 1:
                send_fds(s, &h, sizeof(h), mf, 3);
                break;
            default:
                break;
            }
            for (int k = 0; k < 8; k++)
                send_fds(s, "x", 1, mf, 3);
            close(s);
        }
    for (int i = 0; i < 3; i++)
        close(mf[i]);
    sleep_ms(500);
    assert_int_equal(kill(d.pid, 0), 0); /* alive */
    const int fds1 = fd_count(d.pid);
    const long shm1 = status_kb(d.pid, "RssShmem");
    printf("descriptors %d -> %d, RssShmem %ld -> %ld kB after 1,200 connections passing 28,800 "
           "descriptors\n",
           fds0, fds1, shm0, shm1);
    assert_true(fds1 <= fds0 + 4);
    assert_true(shm1 <= shm0 + 1024);
    by_step(&b);
    pat_conn_t *c = connect_to(&d, "after");
    assert_int_equal(pat_ping(c), 0);
    pat_close(c);
    by_close(&b);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* ---------------------------------------------------------------- bare connections */
static void test_bare_connections(void **state)
{
    struct rlimit lim;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &lim), 0);
    rlim_t want = PAT_MIN(lim.rlim_max, (rlim_t)20300); /* 20,000 where the hard limit allows */
    struct rlimit up = {want, lim.rlim_max};
    setrlimit(RLIMIT_NOFILE, &up);
    const int n = (int)want - 300; /* this process's own descriptors stay clear */
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, NULL), 0);
    bystander_t b;
    by_open(&b, &d, 5000);
    by_step(&b);
    char ev[200];
    path_of(&d, "events", ev, sizeof(ev));
    int *held = malloc((size_t)n * sizeof(int));
    int made = 0;
    for (int i = 0; i < n; i++) {
        held[i] = raw_connect(i % 8 == 7 ? ev : d.sock);
        made += held[i] >= 0;
    }
    sleep_ms(500);
    const int fds = fd_count(d.pid);
    printf("%d bare connections made (%d on .events); the daemon holds %d descriptors\n", made,
           n / 8, fds);
    assert_true(fds < 1000); /* 512 without a session and 64 subscribers at most */
    /* the daemon answers, a new session gets in, the bystander steps */
    uint64_t t0 = pat_now_ns();
    assert_true(tl_daemon_status(&d, "connections") == 1);
    printf("STATUS answered in %.1f ms\n", (pat_now_ns() - t0) / 1e6);
    pat_conn_t *c = connect_to(&d, "newcomer");
    assert_int_equal(pat_ping(c), 0);
    by_step(&b);
    /* no spin: the daemon is idle while they sit there */
    long c0 = cpu_ticks(d.pid);
    sleep_ms(1000);
    long c1 = cpu_ticks(d.pid);
    printf("daemon CPU over 1 s of idle bare connections: %ld ticks\n", c1 - c0);
    assert_true(c1 - c0 < sysconf(_SC_CLK_TCK) / 10);
    /* the log says why connections were closed */
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "grep -q 'connections without a session' %s", d.log);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "grep -q 'events: subscriber .* closed' %s", d.log);
    assert_int_equal(system(cmd), 0);
    for (int i = 0; i < n; i++)
        if (held[i] >= 0)
            close(held[i]);
    free(held);
    pat_close(c);
    by_close(&b);
    setrlimit(RLIMIT_NOFILE, &lim);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* ---------------------------------------------------------------- events */
/* Lines read from an event connection within ms: how many contain `what`. */
static int events_with(int s, const char *what, unsigned ms, int *ret_lines)
{
    char buf[65536];
    size_t have = 0;
    uint64_t end = pat_now_ns() + ms * 1000000ull;
    while (pat_now_ns() < end && have < sizeof(buf) - 1) {
        struct pollfd p = {s, POLLIN, 0};
        if (poll(&p, 1, 50) != 1)
            continue;
        ssize_t k = recv(s, buf + have, sizeof(buf) - 1 - have, 0);
        if (k <= 0)
            break;
        have += (size_t)k;
    }
    buf[have] = 0;
    int n = 0, lines = 0;
    for (char *l = buf; *l;) {
        char *nl = strchr(l, '\n');
        if (!nl)
            break;
        *nl = 0;
        lines++;
        n += strstr(l, what) != NULL;
        l = nl + 1;
    }
    if (ret_lines)
        *ret_lines = lines;
    return n;
}

/* A process of uid `uid` that opens a session, a 64-token prompt (4 full blocks) and steps it
 * once, checked; exits 0 when all went right. */
static pid_t victim(const tl_daemon_t *d, uid_t uid)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid)
        return pid;
    if (setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
        _exit(2);
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 256,
                            .timeout_ms = 10000,
                            .socket = d->sock,
                            .model = MODEL};
    pat_conn_t *c = NULL;
    if (pat_connect(&o, &c, NULL, 0) < 0)
        _exit(3);
    tl_seq_t s, *ps[1] = {&s};
    tl_seq_init(&s);
    for (uint32_t t = 0; t < 65; t++)
        tl_seq_push(&s, 7777 + t * 13); /* the secret prompt */
    tl_rng_t rng;
    tl_rng_seed(&rng, 3);
    tl_step_result_t r;
    if (tl_seq_open(c, &s) < 0 || tl_client_step(c, &MODEL, ps, 1, &rng, 1, &r) < 0 ||
        r.worst > 1e-2)
        _exit(4);
    sleep_ms(300);
    pat_close(c);
    _exit(0);
}

static int sub_as(const char *path, uid_t uid)
{
    /* a subscriber of another user: connect from a child that becomes uid, passed back */
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        if (setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
            _exit(2);
        int s = raw_connect(path);
        if (s < 0)
            _exit(3);
        _exit(send_fds(sv[1], "s", 1, &s, 1) == 1 ? 0 : 4);
    }
    close(sv[1]);
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char c;
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {&c, 1};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
    assert_int_equal(recvmsg(sv[0], &m, 0), 1);
    int s = -1;
    memcpy(&s, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(int));
    close(sv[0]);
    return s;
}

static void test_events_scope(void **state)
{
    if (geteuid() != 0) {
        printf("not root: the events of other users cannot be tried here; skipped\n");
        return;
    }
    static const char *const args[] = {"--socket-mode=0666", NULL};
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, args), 0);
    chmod(d.dir, 0755);
    char ev[200];
    path_of(&d, "events", ev, sizeof(ev));
    const uid_t v = 65534, other = 65533;
    int s_other = sub_as(ev, other), s_self = sub_as(ev, v), s_admin = raw_connect(ev);
    assert_true(s_admin >= 0);
    sleep_ms(100);
    pid_t pid = victim(&d, v);
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("the victim's session failed (exit %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    int lines_other, lines_self, lines_admin;
    int seen_other = events_with(s_other, "stored", 300, &lines_other);
    int seen_self = events_with(s_self, "stored", 300, &lines_self);
    int seen_admin = events_with(s_admin, "stored", 300, &lines_admin);
    printf("stored events: another user %d (of %d lines), the user %d, an admin %d\n", seen_other,
           lines_other, seen_self, seen_admin);
    assert_int_equal(lines_other, 0); /* nothing at all: not its blocks, not its sessions */
    assert_int_equal(seen_self, 4);
    assert_int_equal(seen_admin, 4);
    close(s_other);
    close(s_self);
    close(s_admin);
    /* bounded: a user's 9th subscriber is closed at once */
    int subs[9];
    for (int i = 0; i < 9; i++)
        subs[i] = sub_as(ev, other);
    sleep_ms(200);
    char c;
    int closed = 0;
    for (int i = 0; i < 9; i++) {
        struct pollfd p = {subs[i], POLLIN, 0};
        closed += poll(&p, 1, 0) == 1 && recv(subs[i], &c, 1, MSG_DONTWAIT) == 0;
        close(subs[i]);
    }
    assert_int_equal(closed, 1);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* ---------------------------------------------------------------- BYE behind a step */
typedef struct raw {
    int s;
    uint64_t session, key;
    uint32_t seq;
} raw_t;

static uint64_t corr_next(void)
{
    static uint64_t c = 1000;
    return ++c;
}

static size_t frame(uint8_t *out, uint16_t op, const raw_t *r, const void *body, uint32_t len)
{
    ipc_hdr_t h = {.magic = IPC_MAGIC,
                   .version = IPC_VERSION,
                   .opcode = op,
                   .body_len = len,
                   .corr = corr_next(),
                   .session = r->session,
                   .key = r->key};
    memcpy(out, &h, sizeof(h));
    if (len)
        memcpy(out + sizeof(h), body, len);
    return sizeof(h) + len;
}

/* HELLO on the admin socket, then the control connection bound by a SEQ_OPEN */
static void raw_open(const tl_daemon_t *d, raw_t *r)
{
    char admin[200];
    path_of(d, "admin", admin, sizeof(admin));
    ipc_hello_req_t hr = {.model = {4, 8, 2, 64, PAT_F16, 16, 0},
                          .pid = (uint32_t)getpid(),
                          .max_batch_tokens = 64,
                          .buffer_kind = IPC_BUF_SHM};
    uint8_t f[512];
    raw_t none = {0};
    size_t n = frame(f, IPC_OP_HELLO, &none, &hr, sizeof(hr));
    int a = raw_connect(admin);
    assert_true(a >= 0);
    assert_int_equal(write(a, f, n), (ssize_t)n);
    uint8_t rep[sizeof(ipc_hdr_t) + sizeof(ipc_hello_rep_t)];
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(2 * sizeof(int))];
    } ctl;
    struct iovec iov = {rep, sizeof(rep)};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
    assert_int_equal(recvmsg(a, &m, MSG_WAITALL | MSG_CMSG_CLOEXEC), (ssize_t)sizeof(rep));
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        int fd;
        memcpy(&fd, CMSG_DATA(c), sizeof(fd));
        close(fd);
    }
    close(a);
    ipc_hello_rep_t hp;
    memcpy(&hp, rep + sizeof(ipc_hdr_t), sizeof(hp));
    r->session = hp.session;
    r->key = hp.key;
    r->s = tl_wire_open(d->sock);
    assert_true(r->s >= 0);
    uint32_t ob[2 + 4] = {4, 0, 1, 2, 3, 4};
    n = frame(f, IPC_OP_SEQ_OPEN, r, ob, sizeof(ob));
    assert_int_equal(tl_wire_send(r->s, f, n), 0);
    void *msg = NULL;
    assert_true(tl_wire_recv(r->s, &msg) == (int)(sizeof(ipc_hdr_t) + sizeof(ipc_seq_rep_t)));
    ipc_seq_rep_t sr;
    memcpy(&sr, (uint8_t *)msg + sizeof(ipc_hdr_t), sizeof(sr));
    free(msg);
    r->seq = sr.seq;
}

static void test_bye_behind_step(void **state)
{
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, NULL), 0);
    bystander_t b;
    by_open(&b, &d, 7000);
    uint32_t answered = 0;
    for (int round = 0; round < 1000; round++) {
        raw_t r;
        raw_open(&d, &r);
        struct {
            ipc_step_begin_req_t b;
            ipc_step_seq_t q;
            uint32_t tok[1];
        } __attribute__((packed)) body = {{1, 1, 0, 0}, {r.seq, 1}, {5}};
        uint8_t f[256];
        size_t n = frame(f, IPC_OP_STEP_BEGIN, &r, &body, sizeof(body));
        size_t n2 = frame(f + n, IPC_OP_BYE, &r, NULL, 0);
        if (round % 2 == 0) {
            /* BEGIN and BYE in one write: both are answered, in order */
            assert_int_equal(tl_wire_send(r.s, f, n + n2), 0);
            for (int k = 0; k < 2; k++) {
                void *msg = NULL;
                int got = tl_wire_recv(r.s, &msg);
                if (got < (int)sizeof(ipc_hdr_t))
                    fail_msg("round %d: request %d of 2 not answered (%d)", round, k + 1, got);
                ipc_hdr_t h;
                memcpy(&h, msg, sizeof(h));
                assert_int_equal(h.opcode, k ? IPC_OP_BYE : IPC_OP_STEP_BEGIN);
                free(msg);
                answered++;
            }
        } else {
            /* BEGIN, then the connection's end: the session goes, nothing is left */
            assert_int_equal(tl_wire_send(r.s, f, n), 0);
        }
        close(r.s);
        if (round % 100 == 99)
            by_step(&b);
    }
    for (int t = 0; t < 200 && tl_daemon_status(&d, "connections") != 1; t++)
        sleep_ms(10);
    printf("1,000 rounds: %u answers to BEGIN + BYE pairs; sessions left %lld\n", answered,
           (long long)tl_daemon_status(&d, "connections") - 1);
    assert_int_equal(answered, 1000);
    assert_int_equal(tl_daemon_status(&d, "connections"), 1);
    assert_int_equal(tl_daemon_status(&d, "sequences"), 2);
    assert_int_equal(tl_daemon_status(&d, "pool_check"), 0);
    by_step(&b);
    by_close(&b);
    assert_int_equal(tl_daemon_status(&d, "blocks_used"), 0);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_injection),
        cmocka_unit_test(test_bare_connections),
        cmocka_unit_test(test_events_scope),
        cmocka_unit_test(test_bye_behind_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
