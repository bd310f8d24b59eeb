/*
 * test_ops.c — patd as operators and systemd see it: config file validation and overrides,
 * sd_notify (READY=1, STATUS=, WATCHDOG=1, STOPPING=1) on a notify socket of our own, SIGHUP
 * and `patctl reload` applying reloadable options and refusing, with the cause, a config path that
 * names no config file (/dev/zero, a FIFO, a directory, a file past the cap) without stalling the
 * daemon, the Prometheus endpoint over HTTP, the
 * event socket (connections, stored blocks), and `patctl` commands including drain.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ipc_proto.h" /* IPC_VERSION, for the --version check */
#include "pat.h"
#include "pat_base.h"
#include "tl_client.h"
#include "tl_daemon.h"
#include "tl_wire.h"

static const pat_model_t MODEL = {4, 8, 2, 64, PAT_F16, 16, 0};

static const char *patd_bin(void)
{
    return getenv("PATD_BIN") ? getenv("PATD_BIN") : "build/bin/patd";
}

static const char *patctl_bin(void)
{
    static char path[300];
    snprintf(path, sizeof(path), "%s", patd_bin());
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash + 1 : path, 20, "patctl");
    return path;
}

/* Runs a command line; returns its exit status and up to cap bytes of its stdout+stderr. */
static int run(char *out, size_t cap, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    strcat(cmd, " 2>&1");
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    char rest[4096]; /* read to the end: a program whose output passes cap must not die of
                        SIGPIPE (patd --help grows with every option) */
    while (fread(rest, 1, sizeof(rest), p) > 0)
        ;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A datagram socket bound at /tmp/patd-<stem>.<pid>, as a service manager's notify socket. */
static int notify_socket(char *path, size_t len, const char *stem)
{
    snprintf(path, len, "/tmp/patd-%s.%d", stem, (int)getpid());
    unlink(path);
    int ns = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    assert_int_equal(bind(ns, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return ns;
}

/* Reads the notify socket until a datagram holds `what` or ms pass (its receive timeout must be
 * set). */
static int notify_seen(int ns, const char *what, uint32_t ms)
{
    for (uint64_t t0 = pat_now_ns(); pat_now_ns() - t0 < (uint64_t)ms * 1000000ull;) {
        char msg[512];
        ssize_t m = recv(ns, msg, sizeof(msg) - 1, 0);
        if (m <= 0)
            continue;
        msg[m] = 0;
        if (strstr(msg, what))
            return 1;
    }
    return 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_config_validation(void **state)
{
    char out[32768]; /* --help is over 10 KiB */
    char path[] = "/tmp/patd-conf.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(path, "[daemon]\nexecutors = 3\n[model]\nlayers = 2\nhead_dim = 128\n");
    assert_int_equal(run(out, sizeof(out), "%s --config %s --check-config", patd_bin(), path), 0);
    assert_int_equal(
        run(out, sizeof(out), "%s --config %s --layers=6 --print-config", patd_bin(), path), 0);
    assert_non_null(strstr(out, "layers = 6"));     /* the command line wins */
    assert_non_null(strstr(out, "head_dim = 128")); /* the file */
    assert_non_null(strstr(out, "executors = 3"));
    assert_int_equal(run(out, sizeof(out), "%s --pack-policy=tree --print-config", patd_bin()), 0);
    assert_non_null(strstr(out, "pack_policy = tree"));
    assert_int_equal(
        run(out, sizeof(out), "%s --kv-dtype=fp8_e4m3 --kv-scale=0.5 --print-config", patd_bin()),
        0);
    assert_non_null(strstr(out, "kv_dtype = fp8_e4m3"));
    assert_non_null(strstr(out, "kv_scale = 0.5"));
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"[model]\nhead_dim = 96\n", "model not supported"},
        {"[model]\nlayers = 0\n", "out of range"},
        {"[pool]\nblocks = lots\n", "cannot parse"},
        {"[daemon]\nbogus = 1\n", "unknown option"},
        {"[limits]\nconn_max_seqs = 9000\n", "exceeds pool.max_seqs"},
        {"[daemon\n", "syntax error"},
        {"[daemon]\nliveness = sometimes\n", "liveness"},
        {"[gpu]\nforward = fastest\n", "gpu.forward must be auto, cpasync, tma, layer or mma"},
        {"[gpu]\nmerge = later\n", "gpu.merge must be launch or inside"},
        {"[gpu]\ndependent_launch = 2\n", "dependent_launch"},
        {"[daemon]\npack_policy = fastest\n", "pack_policy must be auto, bytes, paper, query"},
        {"[daemon]\ninvariant = 1\ninvariant_chunk = 100\n",
         "daemon.invariant_chunk must be a multiple of 64 tokens (got 100)"},
        {"[daemon]\ninvariant = 2\n", "invariant"},
        {"[model]\nkv_dtype = fp4\n", "cannot parse"},
        {"[model]\ndtype = f32\nkv_dtype = fp8_e4m3\n",
         "kv_dtype fp8_e4m3 does not go with model.dtype f32"},
        {"[model]\ndtype = bf16\nkv_dtype = f16\n",
         "kv_dtype f16 does not go with model.dtype bf16"},
        {"[model]\nkv_dtype = fp8_e5m2\nkv_scale = 0\n", "model.kv_scale must be > 0"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_file(path, bad[i].text);
        int rc = run(out, sizeof(out), "%s --config %s --check-config", patd_bin(), path);
        if (rc != 1 || !strstr(out, bad[i].why))
            fail_msg("config '%s': status %d, output '%s'", bad[i].text, rc, out);
    }
    assert_int_equal(
        run(out, sizeof(out), "%s --socket-group=no-such-group-xyz --check-config", patd_bin()), 1);
    assert_non_null(strstr(out, "does not exist"));
    assert_int_equal(run(out, sizeof(out), "%s '--name=evil\n<0>x' --check-config", patd_bin()), 1);
    /* a runtime directory another user could write to, or that is a symlink, is refused */
    char squat[] = "/tmp/patd-squat.XXXXXX";
    assert_non_null(mkdtemp(squat));
    chmod(squat, 0777);
    assert_int_equal(
        run(out, sizeof(out), "%s --runtime-dir=%s --metrics-port=0", patd_bin(), squat), 1);
    assert_non_null(strstr(out, "writable by group or others"));
    if (geteuid() == 0) { /* root can hand it to another user, as a squatter would own it */
        chmod(squat, 0755);
        assert_int_equal(chown(squat, 65534, 65534), 0);
        assert_int_equal(
            run(out, sizeof(out), "%s --runtime-dir=%s --metrics-port=0", patd_bin(), squat), 1);
        assert_non_null(strstr(out, "belongs to uid 65534"));
    }
    char link[64];
    snprintf(link, sizeof(link), "%s.link", squat);
    assert_int_equal(symlink(squat, link), 0);
    assert_int_equal(
        run(out, sizeof(out), "%s --runtime-dir=%s --metrics-port=0", patd_bin(), link), 1);
    assert_non_null(strstr(out, "not a directory"));
    unlink(link);
    rmdir(squat);
    assert_int_equal(run(out, sizeof(out), "%s --config /nonexistent.conf", patd_bin()), 1);
    assert_non_null(strstr(out, "cannot open config"));
    /* a config path that names no config file: refused at once with its cause, never read (a
     * read of /dev/zero or of a FIFO no one writes never ended) */
    char notconf[] = "/tmp/patd-notconf.XXXXXX";
    assert_non_null(mkdtemp(notconf));
    char fifo[64];
    snprintf(fifo, sizeof(fifo), "%s/fifo", notconf);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    const struct {
        const char *path, *why;
    } notconfs[] = {
        {notconf, "is a directory, not a regular file"},
        {"/dev/zero", "is a character device, not a regular file"},
        {fifo, "is a FIFO, not a regular file"},
    };
    for (size_t i = 0; i < PAT_ARRAY_SIZE(notconfs); i++) {
        int rc = run(out, sizeof(out), "timeout 5 %s --config %s --metrics-port=0 --check-config",
                     patd_bin(), notconfs[i].path);
        if (rc != 1 || !strstr(out, notconfs[i].why))
            fail_msg("--config %s: status %d, output '%s'", notconfs[i].path, rc, out);
    }
    unlink(fifo);
    rmdir(notconf);
    assert_int_equal(run(out, sizeof(out), "%s --no-such-option=1", patd_bin()), 1);
    assert_int_equal(run(out, sizeof(out), "%s --help", patd_bin()), 0);
    assert_non_null(strstr(out, "step_timeout_ms"));
    assert_int_equal(run(out, sizeof(out), "%s --version", patd_bin()), 0);
    char want[64];
    snprintf(want, sizeof(want), "patd %d.%d.%d (wire protocol %u; backends: cpu",
             PAT_VERSION_MAJOR, PAT_VERSION_MINOR, PAT_VERSION_PATCH, (unsigned)IPC_VERSION);
    if (!strstr(out, want))
        fail_msg("patd --version said '%s', not '%s'", out, want);
    unlink(path);
}

/* A notify socket like systemd's: patd must report READY=1, STATUS=, WATCHDOG=1, STOPPING=1. */
/* A loopback TCP port nothing holds now, below the kernel's ephemeral range (32768 and up by
 * default), where the outgoing connections of anything else on the host (a socket fuzzer's
 * millions) never land between this check and patd's bind. */
static int quiet_port(void)
{
    for (int i = 0; i < 2000; i++) {
        int port = 20000 + (int)((getpid() * 7u + (unsigned)i * 13u) % 12000u);
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int ok = s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (s >= 0)
            close(s);
        if (ok)
            return port;
    }
    return 20000 + (int)(getpid() % 12000);
}

static void test_sd_notify_reload_metrics_events(void **state)
{
    char sockpath[108];
    int ns = notify_socket(sockpath, sizeof(sockpath), "notify");
    struct timeval tv = {0, 200000};
    setsockopt(ns, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setenv("NOTIFY_SOCKET", sockpath, 1);
    setenv("WATCHDOG_USEC", "1000000", 1);

    char conf[] = "/tmp/patd-conf.XXXXXX";
    int fd = mkstemp(conf);
    close(fd);
    write_file(conf, "[limits]\nmax_conns = 8\n");
    int port = quiet_port();
    char a_conf[64], a_port[64];
    snprintf(a_conf, sizeof(a_conf), "--config=%s", conf);
    snprintf(a_port, sizeof(a_port), "--metrics-port=%d", port);
    const char *args[] = {a_conf, a_port, NULL};
    tl_daemon_t d;
    unsetenv("WATCHDOG_PID"); /* it would have to be patd's pid */
    assert_int_equal(tl_daemon_start(&d, args), 0);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");

    int ready = 0, watchdog = 0, status = 0;
    uint64_t t0 = pat_now_ns();
    while ((!ready || !watchdog || !status) && pat_now_ns() - t0 < 3000000000ull) {
        char msg[512];
        ssize_t n = recv(ns, msg, sizeof(msg) - 1, 0);
        if (n <= 0)
            continue;
        msg[n] = 0;
        ready |= strstr(msg, "READY=1") != NULL;
        watchdog |= strstr(msg, "WATCHDOG=1") != NULL;
        status |= strstr(msg, "STATUS=") != NULL;
    }
    assert_true(ready);
    assert_true(status);
    assert_true(watchdog); /* the executors move */

    /* events: a subscriber sees a connection come up and blocks being stored */
    char url[256];
    snprintf(url, sizeof(url), "%s/patd.events", d.dir);
    int sub = tl_wire_open(url);
    assert_true(sub >= 0);
    usleep(100000); /* the daemon accepts it on its loop */
    pat_connect_opts_t o = {
        .size = sizeof(o), .max_batch_tokens = 64, .socket = d.sock, .model = MODEL};
    pat_conn_t *c;
    assert_int_equal(pat_connect(&o, &c, NULL, 0), 0);
    tl_seq_t s, *ps[1] = {&s};
    tl_seq_init(&s);
    for (uint32_t t = 0; t < 33; t++)
        tl_seq_push(&s, t);
    assert_int_equal(tl_seq_open(c, &s), 0);
    tl_rng_t rng;
    tl_rng_seed(&rng, 1);
    tl_step_result_t r;
    assert_int_equal(tl_client_step(c, &MODEL, ps, 1, &rng, 1, &r), 0);
    int up = 0, stored = 0;
    char text[8192];
    size_t have = 0;
    for (int i = 0; i < 20 && !(up && stored >= 2) && have < sizeof(text) - 1; i++) {
        struct pollfd p = {sub, POLLIN, 0};
        if (poll(&p, 1, 200) != 1)
            continue;
        ssize_t k = recv(sub, text + have, sizeof(text) - 1 - have, 0);
        if (k <= 0)
            break;
        have += (size_t)k;
        text[have] = 0;
        up = stored = 0; /* one event a line */
        for (char *l = text; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
            up |= !strncmp(l, "conn up", 7);
            stored += !strncmp(l, "stored", 6);
        }
    }
    close(sub);
    assert_true(up);
    assert_int_equal(stored, 2); /* 33 tokens: two full blocks published */

    /* metrics over HTTP on loopback, while 40 idle connections (anyone on the host may open
     * them) sit on the server: they must not lock the scraper out */
    struct sockaddr_in ha = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    ha.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int idle[40];
    for (int i = 0; i < 40; i++) {
        idle[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(connect(idle[i], (struct sockaddr *)&ha, sizeof(ha)), 0);
    }
    int hs = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval htv = {5, 0};
    setsockopt(hs, SOL_SOCKET, SO_RCVTIMEO, &htv, sizeof(htv));
    assert_int_equal(connect(hs, (struct sockaddr *)&ha, sizeof(ha)), 0);
    const char *get = "GET /metrics HTTP/1.0\r\n\r\n";
    assert_int_equal(write(hs, get, strlen(get)), (ssize_t)strlen(get));
    static char resp[65536];
    size_t got = 0;
    ssize_t n;
    while ((n = read(hs, resp + got, sizeof(resp) - 1 - got)) > 0)
        got += (size_t)n;
    resp[got] = 0;
    close(hs);
    for (int i = 0; i < 40; i++)
        close(idle[i]);
    assert_non_null(strstr(resp, "200 OK"));
    assert_non_null(strstr(resp, "patd_steps_total 1\n"));
    assert_non_null(strstr(resp, "patd_kv_blocks_used"));
    assert_non_null(strstr(resp, "patd_jemalloc_enabled"));
    assert_non_null(strstr(resp, "patd_prefix_hit_blocks_total"));

    /* SIGHUP applies a reloadable option: max_conns 8 -> 1 refuses a second session */
    write_file(conf, "[limits]\nmax_conns = 1\n[pool]\nblocks = 99\n");
    kill(d.pid, SIGHUP);
    usleep(300000);
    pat_conn_t *c2 = NULL;
    char why[256];
    assert_int_equal(pat_connect(&o, &c2, why, sizeof(why)), -EMFILE);
    /* patctl reload back to 8 */
    write_file(conf, "[limits]\nmax_conns = 8\n");
    char out[8192];
    assert_int_equal(run(out, sizeof(out), "%s --socket %s reload", patctl_bin(), d.sock), 0);
    assert_int_equal(pat_connect(&o, &c2, why, sizeof(why)), 0);
    pat_close(c2);
    /* the typed status shows the reloaded limit, the versions and the model */
    pat_status_t st = {.size = sizeof(st)};
    assert_int_equal(pat_status(d.sock, 2000, &st), 0);
    assert_int_equal(st.size, sizeof(st));
    assert_int_equal(st.max_conns, 8);
    assert_int_equal(st.version, PAT_VERSION);
    assert_int_equal(st.protocol, IPC_VERSION);
    assert_int_equal(st.pid, (uint32_t)d.pid);
    assert_int_equal(st.model.n_layers, o.model.n_layers);
    assert_int_equal(st.model.head_dim, o.model.head_dim);
    assert_int_equal(st.connections, 1);
    assert_false(st.draining);
    pat_status_t small = {.size = 8};
    assert_int_equal(pat_status(d.sock, 2000, &small), -EINVAL);
    /* an invalid file is refused as a whole */
    write_file(conf, "[limits]\nmax_conns = 0\n");
    assert_int_equal(run(out, sizeof(out), "%s --socket %s reload", patctl_bin(), d.sock), 1);
    assert_non_null(strstr(out, "invalid"));
    char logtext[65536];
    assert_int_equal(run(logtext, sizeof(logtext), "cat %s", d.log), 0);
    assert_non_null(strstr(logtext, "pool.blocks changed in the file but needs a restart"));

    /* patctl: status, stats as a table and as JSON (parsed by python), seqs */
    assert_int_equal(run(out, sizeof(out), "%s --socket %s status", patctl_bin(), d.sock), 0);
    char proto[32];
    snprintf(proto, sizeof(proto), "protocol %u\n", (unsigned)IPC_VERSION);
    assert_non_null(strstr(out, proto));
    assert_null(strstr(out, "pool_check")); /* the O(blocks) check is off the status path */
    assert_int_equal(run(out, sizeof(out), "%s --socket %s check", patctl_bin(), d.sock), 0);
    assert_non_null(strstr(out, "pool_check ok"));
    assert_int_equal(run(out, sizeof(out),
                         "%s --socket %s stats --json | /usr/bin/python3 -c 'import json,sys; "
                         "d=json.load(sys.stdin); print(d[\"patd_steps_total\"])'",
                         patctl_bin(), d.sock),
                     0);
    assert_string_equal(out, "1\n");
    assert_int_equal(run(out, sizeof(out), "%s --socket %s seqs", patctl_bin(), d.sock), 0);
    assert_non_null(strstr(out, " 33 3 0")); /* one sequence: 33 tokens, 3 blocks */
    assert_int_equal(run(out, sizeof(out), "%s --socket /nonexistent/x.sock status", patctl_bin()),
                     1);
    assert_int_equal(run(out, sizeof(out), "%s frobnicate", patctl_bin()), 2);

    /* patctl drain: the open session is closed, patd exits 0 and says STOPPING=1 */
    assert_int_equal(run(out, sizeof(out), "%s --socket %s drain", patctl_bin(), d.sock), 0);
    assert_true(notify_seen(ns, "STOPPING=1", 3000));
    assert_int_equal(tl_daemon_signal_wait(&d, 0, 5000), 0);
    assert_int_equal(pat_ping(c), -ESHUTDOWN); /* the drain ended the session, and says so */
    pat_close(c);
    tl_seq_done(&s);
    tl_daemon_stop(&d);
    close(ns);
    unlink(sockpath);
    unlink(conf);
}

/* Under a file-size limit smaller than a staging buffer (LimitFSIZE=), the HELLO that needs one
 * is refused; the kernel's SIGXFSZ used to kill patd there. */
static void test_fsize_limit(void **state)
{
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    /* the soft limit only: without CAP_SYS_RESOURCE a lowered hard limit could not be raised
     * back, and the tests after this one would run under it */
    lim = (struct rlimit){1u << 20, old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0); /* inherited by the daemon */
    tl_daemon_t d;
    int started = tl_daemon_start(&d, NULL);
    setrlimit(RLIMIT_FSIZE, &old);
    assert_int_equal(started, 0);
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 4096,
                            .socket = d.sock,
                            .model = MODEL}; /* ~10 MiB of staging rows */
    pat_conn_t *c = NULL;
    char why[256];
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), -ENOMEM);
    assert_non_null(strstr(why, "staging buffer"));
    o.max_batch_tokens = 64; /* a small one still fits: the daemon serves on */
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), 0);
    assert_int_equal(pat_ping(c), 0);
    pat_close(c);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* With /dev/shm nearly full (a small tmpfs in a private mount namespace, the rest taken by a
 * file), sessions still open and step: staging buffers are memfds now, not files in /dev/shm
 * (they were a sparse file there once, and a full /dev/shm then killed patd with SIGBUS, later
 * refused the HELLO). Needs root (skipped otherwise). */
static void test_shm_full(void **state)
{
    if (geteuid() != 0 || unshare(CLONE_NEWNS) != 0) {
        printf("not root or no mount namespace: skipped\n");
        return;
    }
    assert_int_equal(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), 0);
    assert_int_equal(mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=4m"), 0);
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, NULL), 0);
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 64,
                            .max_seqs = 4,
                            .timeout_ms = 10000,
                            .socket = d.sock,
                            .model = MODEL};
    pat_conn_t *by = NULL, *c = NULL;
    char why[256];
    assert_int_equal(pat_connect(&o, &by, why, sizeof(why)), 0);
    /* all but 64 KiB of the rest goes to a file */
    struct statvfs v;
    assert_int_equal(statvfs("/dev/shm", &v), 0);
    const size_t fill = (size_t)v.f_bavail * v.f_frsize - (64u << 10);
    FILE *f = fopen("/dev/shm/filler", "w");
    assert_non_null(f);
    char chunk[4096];
    memset(chunk, 1, sizeof(chunk));
    for (size_t n = 0; n + sizeof(chunk) <= fill; n += sizeof(chunk))
        assert_int_equal(fwrite(chunk, 1, sizeof(chunk), f), sizeof(chunk));
    assert_int_equal(fclose(f), 0);
    o.max_batch_tokens = 512; /* ~1.3 MiB of staging rows: more than /dev/shm has left */
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), 0);
    pat_close(c);
    /* the bystander steps on, checked */
    tl_seq_t s;
    tl_seq_init(&s);
    for (uint32_t t = 0; t < 16; t++)
        tl_seq_push(&s, 40 + t);
    assert_int_equal(tl_seq_open(by, &s), 0);
    tl_seq_t *ps = &s;
    tl_rng_t rng;
    tl_rng_seed(&rng, 3);
    tl_step_result_t r;
    assert_int_equal(tl_client_step(by, &MODEL, &ps, 1, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    tl_seq_done(&s);
    pat_close(by);
    unlink("/dev/shm/filler");
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
    assert_int_equal(umount("/dev/shm"), 0);
}

/* Started under a soft open-file limit of 64 (systemd's default soft limit is 1024, and a
 * frontend fleet or a hostile local user opens connections without a HELLO), patd raises it to
 * the hard limit: 150 idle connections later it still answers (the oldest idle ones without a
 * session make room). It used to spin in nanomsg's accept at EMFILE while every new client
 * hung. */
static void test_nofile_limit(void **state)
{
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    if (old.rlim_max < 1024) {
        printf("hard open-file limit %llu: nothing to raise to; skipped\n",
               (unsigned long long)old.rlim_max);
        return;
    }
    lim = (struct rlimit){64, old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &lim), 0); /* inherited by the daemon */
    tl_daemon_t d;
    int started = tl_daemon_start(&d, NULL);
    setrlimit(RLIMIT_NOFILE, &old);
    assert_int_equal(started, 0);
    enum { IDLE = 150 };
    int idle[IDLE];
    for (int i = 0; i < IDLE; i++) /* beyond the per-user bound the daemon closes them */
        idle[i] = tl_wire_open(d.sock);
    usleep(300000); /* the daemon accepts (and closes) them on its loop */
    pat_status_t st = {.size = sizeof(st)};
    assert_int_equal(pat_status(d.sock, 3000, &st), 0);
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 64,
                            .socket = d.sock,
                            .timeout_ms = 3000,
                            .model = MODEL};
    pat_conn_t *c = NULL;
    char why[256];
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), 0);
    pat_close(c);
    for (int i = 0; i < IDLE; i++)
        if (idle[i] >= 0)
            close(idle[i]);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* A connection to d's admin socket, held open: its fd. */
static int admin_hold(const tl_daemon_t *d)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t n = strlen(d->sock);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%.*s.admin", (int)(n - 5), d->sock);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* A session on d with the small options these tests use (4 sequences, 64 batch tokens), or NULL
 * (the daemon's reason in why). */
static pat_conn_t *small_session(const tl_daemon_t *d, char *why, size_t why_len)
{
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 64,
                            .max_seqs = 4,
                            .timeout_ms = 10000,
                            .socket = d->sock,
                            .model = MODEL};
    pat_conn_t *c = NULL;
    return pat_connect(&o, &c, why, why_len) == 0 ? c : NULL;
}

/* In a forked child: become nobody and open a small session, or _exit (2: the uid, 3: HELLO). */
static pat_conn_t *nobody_session(const tl_daemon_t *d)
{
    if (setgroups(0, NULL) || setgid(65534) || setuid(65534))
        _exit(2);
    char why[256];
    pat_conn_t *c = small_session(d, why, sizeof(why));
    if (!c) {
        fprintf(stderr, "nobody: %s\n", why);
        _exit(3);
    }
    return c;
}

/* One sequence of the n tokens first.. opened on c and stepped once: 1 when the step ran (and,
 * with check, agreed with float64). With lie != 0 the K and V handed over are not the prompt's
 * (a client that lies: every position's values drawn for another token history). *ret_cached
 * (if given): the cached length at open. */
static int prompt_step(pat_conn_t *c, uint32_t first, uint32_t n, uint64_t lie, int check,
                       uint32_t *ret_cached)
{
    tl_seq_t s;
    tl_seq_init(&s);
    for (uint32_t t = 0; t < n; t++)
        tl_seq_push(&s, first + t);
    for (uint32_t t = 0; t < n && lie; t++)
        s.hash[t] ^= lie;
    tl_seq_t *ps = &s;
    tl_rng_t rng;
    tl_rng_seed(&rng, first);
    tl_step_result_t r;
    int ok = tl_seq_open(c, &s) == 0;
    if (ret_cached)
        *ret_cached = s.cached;
    ok =
        ok && tl_client_step(c, &MODEL, &ps, 1, &rng, check, &r) == 0 && (!check || r.worst < 1e-2);
    tl_seq_done(&s);
    return ok;
}

/* One session as another user (nobody, in a forked child that drops root): connect (HELLO on
 * the admin socket) and one checked step. The child's exit status: 0 when all went right.
 * Forks a child that becomes nobody and, once a byte arrives on *ret_go (at once when ret_go is
 * NULL), connects, steps and exits 0 if the step was right. Fork it before this process holds a
 * live connection. */
static pid_t nobody_child(const tl_daemon_t *d, int *ret_go)
{
    int p[2] = {-1, -1};
    if (ret_go)
        assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char b;
        if (ret_go) {
            close(p[1]);
            if (read(p[0], &b, 1) != 1)
                _exit(5);
        }
        pat_conn_t *c = nobody_session(d);
        int ok = prompt_step(c, 60, 8, 0, 1, NULL);
        pat_close(c);
        _exit(ok ? 0 : 4);
    }
    if (ret_go) {
        close(p[0]);
        *ret_go = p[1];
    }
    return pid;
}

static int nobody_wait(pid_t pid)
{
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

static int step_as_nobody(const tl_daemon_t *d)
{
    return nobody_wait(nobody_child(d, NULL));
}

/* A session as nobody (a forked child) that commits the 48-token prompt 70.. and exits, with
 * K and V that are not the prompt's when lie. The child's exit status: 0 when its step ran. */
static pid_t prompt_as_nobody(const tl_daemon_t *d, int lie)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        pat_conn_t *c = nobody_session(d);
        int ok = prompt_step(c, 70, 48, lie ? 0x5a5a5a5aull : 0, 0, NULL);
        pat_close(c);
        _exit(ok ? 0 : 4);
    }
    return pid;
}

/* The same prompt opened here (root) after nobody committed it: its cached length, and whether
 * the step that computes the rest agreed with float64. */
static uint32_t prompt_as_root(const tl_daemon_t *d, int *ret_right)
{
    char why[256];
    pat_conn_t *c = small_session(d, why, sizeof(why));
    assert_non_null(c);
    uint32_t cached = 0;
    *ret_right = prompt_step(c, 70, 48, 0, 1, &cached);
    pat_close(c);
    return cached;
}

/* pool.prefix_scope = uid (the default): one user's K and V for a prompt never reach another
 * user's sequences. nobody commits a prompt with K and V that are not the prompt's; root opens
 * the same prompt, gets nothing from the cache and a right answer (with the scope of every
 * session, it got 32 cached tokens of the lie and a wrong answer). With prefix_scope = all an
 * honest nobody's prompt is found (32 tokens): the sharing trusted deployments may choose. Needs
 * root (skipped otherwise). */
static void test_prefix_scope(void **state)
{
    if (geteuid() != 0) {
        printf("not root: skipped\n");
        return;
    }
    static const char *const uid_args[] = {"--socket-mode=0666", NULL};
    static const char *const all_args[] = {"--socket-mode=0666", "--prefix-scope=all", NULL};
    for (int all = 0; all < 2; all++) {
        tl_daemon_t d;
        assert_int_equal(tl_daemon_start(&d, all ? all_args : uid_args), 0);
        chmod(d.dir, 0755);
        assert_int_equal(nobody_wait(prompt_as_nobody(&d, !all)), 0);
        int right = 0;
        const uint32_t cached = prompt_as_root(&d, &right);
        assert_int_equal(cached, all ? 32 : 0);
        assert_true(right);
        assert_int_equal(tl_daemon_status(&d, "pool_check"), 0);
        assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
        tl_daemon_stop(&d);
    }
}

/* HELLO is served on the admin socket, whose connections are bounded: one user holding idle
 * connections (up to PATD_ADMIN_PER_UID = 4 of them) cannot keep another user's sessions from
 * opening; its own next connections wait for one of those (not closed: a burst of one user's
 * frontends is served in turn), and are served once one closes. Needs root (skipped otherwise).
 */
static void test_admin_per_uid(void **state)
{
    if (geteuid() != 0) {
        printf("not root: skipped\n");
        return;
    }
    static const char *const open_args[] = {"--socket-mode=0666", NULL};
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, open_args), 0);
    chmod(d.dir, 0755);
    int held[4];
    for (int i = 0; i < 4; i++)
        held[i] = admin_hold(&d);
    usleep(100 * 1000); /* accepted by the daemon's loop */
    /* a fifth from this uid waits: neither served nor closed */
    int fifth = admin_hold(&d);
    struct pollfd p = {fifth, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 200), 0);
    /* so does this uid's HELLO, behind it, until its timeout (the held ones idle out later) */
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 64,
                            .timeout_ms = 1000,
                            .socket = d.sock,
                            .model = MODEL};
    pat_conn_t *c = NULL;
    char why[256];
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), -ETIMEDOUT);
    assert_non_null(strstr(why, "HELLO"));
    /* another user opens a session and steps meanwhile */
    assert_int_equal(step_as_nobody(&d), 0);
    /* a slot frees: the waiting ones are served in turn, this uid's next HELLO too */
    for (int i = 0; i < 4; i++)
        close(held[i]);
    o.timeout_ms = 3000;
    assert_int_equal(pat_connect(&o, &c, why, sizeof(why)), 0);
    pat_close(c);
    close(fifth);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* limits.conns_per_uid: a user's HELLO past its share is refused with -EMFILE, while another
 * user still opens a session and steps (that half needs root: skipped otherwise);
 * once the user closes one of its sessions it may open another. */
static void test_conns_per_uid(void **state)
{
    static const char *const args[] = {"--socket-mode=0666", "--conns-per-uid=2", NULL};
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, args), 0);
    chmod(d.dir, 0755);
    const int root = geteuid() == 0;
    int go = -1;
    const pid_t nobody = root ? nobody_child(&d, &go) : -1;
    pat_connect_opts_t o = {.size = sizeof(o),
                            .max_batch_tokens = 64,
                            .max_seqs = 4,
                            .timeout_ms = 3000,
                            .socket = d.sock,
                            .model = MODEL};
    pat_conn_t *c[3] = {NULL, NULL, NULL};
    char why[256];
    assert_int_equal(pat_connect(&o, &c[0], why, sizeof(why)), 0);
    assert_int_equal(pat_connect(&o, &c[1], why, sizeof(why)), 0);
    assert_int_equal(pat_connect(&o, &c[2], why, sizeof(why)), -EMFILE);
    assert_non_null(strstr(why, "conns_per_uid"));
    if (root) { /* this user is at its cap: another one still opens a session and steps */
        assert_int_equal(write(go, "g", 1), 1);
        close(go);
        assert_int_equal(nobody_wait(nobody), 0);
    } else
        printf("not root: the other user's half skipped\n");
    /* the sessions held still work, and closing one makes room */
    tl_seq_t s;
    tl_seq_init(&s);
    for (uint32_t t = 0; t < 8; t++)
        tl_seq_push(&s, 30 + t);
    tl_seq_t *ps = &s;
    tl_rng_t rng;
    tl_rng_seed(&rng, 9);
    tl_step_result_t r;
    assert_int_equal(tl_seq_open(c[1], &s), 0);
    assert_int_equal(tl_client_step(c[1], &MODEL, &ps, 1, &rng, 1, &r), 0);
    assert_true(r.worst < 1e-2);
    pat_close(c[0]);
    usleep(100 * 1000); /* the BYE reaches the loop */
    assert_int_equal(pat_connect(&o, &c[2], why, sizeof(why)), 0);
    pat_close(c[2]);
    pat_close(c[1]);
    tl_seq_done(&s);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
}

/* A reload from a config path that became no config file: patd stays responsive (its loop never
 * reads the file), keeps its reloadable options, says why in its log and in patctl's answer, and
 * still exits on SIGTERM at once. One daemon per kind, so that each is judged alone. */
typedef enum bad_conf { BAD_DEVZERO, BAD_FIFO, BAD_DIR, BAD_BIG } bad_conf_t;
static const struct {
    const char *what, *why;
} bad_confs[] = {
    [BAD_DEVZERO] = {"a symlink to /dev/zero", "is a character device, not a regular file"},
    [BAD_FIFO] = {"a FIFO no one writes", "is a FIFO, not a regular file"},
    [BAD_DIR] = {"a directory", "is a directory, not a regular file"},
    [BAD_BIG] = {"a valid file of 2 MiB (the cap is 1 MiB)", "is larger than 1048576 bytes"},
};

/* Whether the daemon's log holds text within ms. */
static int log_has(const tl_daemon_t *d, const char *text, uint32_t ms)
{
    static char buf[1 << 16];
    for (uint64_t t0 = pat_now_ns(); pat_now_ns() - t0 < (uint64_t)ms * 1000000ull;) {
        FILE *f = fopen(d->log, "r");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = 0;
        if (strstr(buf, text))
            return 1;
        usleep(20000);
    }
    return 0;
}

/* patd answers patctl status within a second, and still has max_conns 8 (the file's). */
static void assert_responsive(tl_daemon_t *d, const char *when)
{
    char out[4096];
    int rc = run(out, sizeof(out), "timeout 2 %s --socket %s --timeout 1000 status", patctl_bin(),
                 d->sock);
    if (rc != 0)
        fail_msg("%s: patctl status exited %d: %s", when, rc, out);
    assert_int_equal(tl_daemon_status(d, "max_conns"), 8);
}

static void reload_bad_conf(bad_conf_t k)
{
    char dir[] = "/tmp/patd-reload.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char conf[64], a_conf[80];
    snprintf(conf, sizeof(conf), "%s/patd.conf", dir);
    snprintf(a_conf, sizeof(a_conf), "--config=%s", conf);
    write_file(conf, "[limits]\nmax_conns = 8\n");
    const char *args[] = {a_conf, NULL};
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, args), 0);
    assert_responsive(&d, "at start");
    unlink(conf);
    switch (k) {
    case BAD_DEVZERO:
        assert_int_equal(symlink("/dev/zero", conf), 0);
        break;
    case BAD_FIFO:
        assert_int_equal(mkfifo(conf, 0600), 0);
        break;
    case BAD_DIR:
        assert_int_equal(mkdir(conf, 0700), 0);
        break;
    case BAD_BIG: { /* what it sets would apply, were it read */
        FILE *f = fopen(conf, "w");
        assert_non_null(f);
        fputs("[limits]\nmax_conns = 3\n", f);
        for (int i = 0; i < 32768; i++)
            fputs("# ..............................................................\n", f);
        fclose(f);
        break;
    }
    }
    char when[96], out[4096];
    kill(d.pid, SIGHUP);
    usleep(300000);
    snprintf(when, sizeof(when), "SIGHUP with the config %s", bad_confs[k].what);
    assert_responsive(&d, when);
    if (!log_has(&d, bad_confs[k].why, 3000)) /* and the reload is over: patctl's is not refused */
        fail_msg("%s: the log does not say '%s' (log %s)", when, bad_confs[k].why, d.log);
    int rc = run(out, sizeof(out), "timeout 5 %s --socket %s --timeout 3000 reload", patctl_bin(),
                 d.sock);
    if (rc != 1 || !strstr(out, bad_confs[k].why) || !strstr(out, "nothing changed"))
        fail_msg("patctl reload with the config %s: status %d, '%s'", bad_confs[k].what, rc, out);
    snprintf(when, sizeof(when), "patctl reload with the config %s", bad_confs[k].what);
    assert_responsive(&d, when);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);
    rmdir(conf);
    unlink(conf);
    rmdir(dir);
}

static void test_reload_devzero(void **state)
{
    reload_bad_conf(BAD_DEVZERO);
}

static void test_reload_fifo(void **state)
{
    reload_bad_conf(BAD_FIFO);
}

static void test_reload_dir(void **state)
{
    reload_bad_conf(BAD_DIR);
}

static void test_reload_big(void **state)
{
    reload_bad_conf(BAD_BIG);
}

/* Who may change the daemon: DRAIN, RELOAD, CHECK and UPGRADE go to the admin socket, where the
 * kernel names the caller; on the control socket they are refused. Another user (nobody, via
 * setpriv) may read the status but not reload, check, drain or upgrade; a member of
 * daemon.admin_group may. Before, any member of the socket group could. */
static void test_admin_rights(void **state)
{
    char out[4096];
    static const char *const open_args[] = {"--socket-mode=0666", NULL};
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, open_args), 0);
    /* a raw DRAIN, then a raw UPGRADE, on the control socket */
    static const uint16_t raw_ops[] = {IPC_OP_DRAIN, IPC_OP_UPGRADE};
    for (int i = 0; i < 2; i++) {
        int s = tl_wire_open(d.sock);
        assert_true(s >= 0);
        ipc_hdr_t h = {.magic = IPC_MAGIC, .version = IPC_VERSION, .opcode = raw_ops[i], .corr = 5};
        assert_int_equal(tl_wire_send(s, &h, sizeof(h)), 0);
        void *msg = NULL;
        int n = tl_wire_recv(s, &msg);
        assert_true(n == (int)(sizeof(ipc_hdr_t) + sizeof(ipc_err_body_t)));
        ipc_err_body_t e;
        memcpy(&e, (uint8_t *)msg + sizeof(ipc_hdr_t), sizeof(e));
        assert_int_equal(e.code, -EPERM);
        assert_non_null(strstr(e.msg, "admin socket"));
        free(msg);
        close(s);
    }
    pat_status_t st = {.size = sizeof(st)};
    assert_int_equal(pat_status(d.sock, 2000, &st), 0);
    assert_false(st.draining);
    const uint32_t pid = st.pid; /* no successor took over */
    if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
        printf("not root or no setpriv: the other-user cases are skipped\n");
        assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
        tl_daemon_stop(&d);
        return;
    }
    chmod(d.dir, 0755); /* others may reach the sockets (their mode is 0666) */
    const char *as_nobody = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups";
    if (run(out, sizeof(out), "%s test -x %s", as_nobody, patctl_bin()) != 0) {
        printf("nobody cannot run %s (a private checkout): the other-user cases are skipped\n",
               patctl_bin());
        assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
        tl_daemon_stop(&d);
        return;
    }
    assert_int_equal(
        run(out, sizeof(out), "%s %s --socket %s status", as_nobody, patctl_bin(), d.sock), 0);
    static const char *const changes[] = {"reload", "check", "drain", "upgrade"};
    for (int i = 0; i < 4; i++) {
        int rc = run(out, sizeof(out), "%s %s --socket %s %s", as_nobody, patctl_bin(), d.sock,
                     changes[i]);
        if (rc != 1 || !strstr(out, "admin_group"))
            fail_msg("patctl %s as nobody: status %d, '%s'", changes[i], rc, out);
    }
    assert_int_equal(pat_status(d.sock, 2000, &st), 0);
    assert_false(st.draining); /* still serving, and the same daemon */
    assert_int_equal(st.pid, pid);
    assert_int_equal(tl_daemon_signal_wait(&d, SIGTERM, 5000), 0);
    tl_daemon_stop(&d);

    /* with daemon.admin_group = nogroup, nobody (primary group nogroup) may */
    if (!getgrnam("nogroup")) {
        printf("no group nogroup: the admin_group case is skipped\n");
        return;
    }
    static const char *const group_args[] = {"--socket-mode=0666", "--admin-group=nogroup", NULL};
    assert_int_equal(tl_daemon_start(&d, group_args), 0);
    chmod(d.dir, 0755);
    assert_int_equal(
        run(out, sizeof(out), "%s %s --socket %s check", as_nobody, patctl_bin(), d.sock), 0);
    assert_non_null(strstr(out, "pool_check ok"));
    assert_int_equal(
        run(out, sizeof(out), "%s %s --socket %s drain", as_nobody, patctl_bin(), d.sock), 0);
    int rc = -1;
    for (int i = 0; i < 100 && d.pid > 0; i++) {
        int wst;
        if (waitpid(d.pid, &wst, WNOHANG) == d.pid) {
            rc = WIFEXITED(wst) ? WEXITSTATUS(wst) : -1;
            d.pid = 0;
        }
        usleep(50000);
    }
    assert_int_equal(rc, 0); /* drained and exited */
    tl_daemon_stop(&d);
}

/* A service manager that stops reading its notify socket (its datagram queue fills after
 * net.unix.max_dgram_qlen messages, 10 by default) must not stall the daemon: sd_notify's
 * blocking send did, and every client then timed out. With a watchdog pinging at its fastest,
 * the queue is full within a second; requests keep being answered for three, and the drain's
 * STOPPING=1, kept while the queue is full, arrives once the manager reads again. */
static void test_notify_never_read(void **state)
{
    char sockpath[108];
    int ns = notify_socket(sockpath, sizeof(sockpath), "notify-full");
    setenv("NOTIFY_SOCKET", sockpath, 1);
    setenv("WATCHDOG_USEC", "200000", 1); /* a ping every tick */
    unsetenv("WATCHDOG_PID");
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start(&d, NULL), 0);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    uint64_t t0 = pat_now_ns(), worst = 0;
    uint32_t answered = 0;
    while (pat_now_ns() - t0 < 3000000000ull) {
        uint64_t t = pat_now_ns();
        pat_status_t st = {.size = sizeof(st)};
        assert_int_equal(pat_status(d.sock, 2000, &st), 0);
        worst = PAT_MAX(worst, pat_now_ns() - t);
        answered++;
        usleep(20000);
    }
    printf("notify queue full: %u requests answered in 3 s, slowest %.1f ms\n", answered,
           worst / 1e6);
    assert_true(answered >= 20);
    /* drain: STOPPING=1 cannot go out until the queue has room, and then it does */
    char out[256];
    assert_int_equal(run(out, sizeof(out), "%s --socket %s drain", patctl_bin(), d.sock), 0);
    struct timeval tv = {0, 200000};
    setsockopt(ns, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    assert_true(notify_seen(ns, "STOPPING=1", 5000));
    /* idle executors beat every 100 ms, the check runs every 100 ms: with WatchdogSec=200ms that
     * once read as a stall at start and at drain; nothing stalled here */
    assert_int_equal(tl_daemon_signal_wait(&d, 0, 5000), 0); /* the drain ends, logged */
    char *log = NULL;
    size_t log_len = 0;
    FILE *lf = fopen(d.log, "r");
    assert_non_null(lf);
    FILE *m = open_memstream(&log, &log_len);
    for (int ch; (ch = fgetc(lf)) != EOF;)
        fputc(ch, m);
    fclose(lf);
    fclose(m);
    if (strstr(log, "watchdog:"))
        fail_msg("a false watchdog warning:\n%s", log);
    free(log);
    tl_daemon_stop(&d);
    close(ns);
    unlink(sockpath);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_validation),
        cmocka_unit_test(test_sd_notify_reload_metrics_events),
        cmocka_unit_test(test_reload_devzero),
        cmocka_unit_test(test_reload_fifo),
        cmocka_unit_test(test_reload_dir),
        cmocka_unit_test(test_reload_big),
        cmocka_unit_test(test_notify_never_read),
        cmocka_unit_test(test_fsize_limit),
        cmocka_unit_test(test_shm_full),
        cmocka_unit_test(test_nofile_limit),
        cmocka_unit_test(test_admin_rights),
        cmocka_unit_test(test_admin_per_uid),
        cmocka_unit_test(test_conns_per_uid),
        cmocka_unit_test(test_prefix_scope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
