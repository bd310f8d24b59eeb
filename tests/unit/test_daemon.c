/*
 * test_daemon.c — the daemon's pieces that need no running daemon: the step state machine's
 * table, the option table (parsing, bounds, command-line precedence), its reload rules
 * (restart-only rows, apply hooks) and what files it reads (regular ones of bounded size), and the
 * watchdog's rule on a simulated clock.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "patd_config.h"
#include "patd_log.h"
#include "patd_notify.h"
#include "patd_step.h"
#include "pat_base.h"
#include "tl_rng.h"

/* ------------------------------------------------------------------ step states */
static void test_step_moves(void **state)
{
    /* the diagram of patd_step.h, written out independently of patd_step.c's table */
    static const struct {
        patd_step_state_t from, to;
    } legal[] = {
        {STEP_IDLE, STEP_QUEUED},         {STEP_IDLE, STEP_REFUSED},
        {STEP_QUEUED, STEP_PREPARING},    {STEP_REFUSED, STEP_EMPTY},
        {STEP_PREPARING, STEP_RUNNING},   {STEP_PREPARING, STEP_EMPTY},
        {STEP_PREPARING, STEP_UNSTARTED}, {STEP_RUNNING, STEP_BACK},
        {STEP_EMPTY, STEP_UNSTARTED},     {STEP_BACK, STEP_IDLE},
        {STEP_UNSTARTED, STEP_IDLE},
    };
    uint32_t n_legal = 0;
    for (int f = 0; f < STEP_N_STATES; f++)
        for (int t = 0; t < STEP_N_STATES; t++) {
            int want = 0;
            for (size_t i = 0; i < PAT_ARRAY_SIZE(legal); i++)
                want |=
                    legal[i].from == (patd_step_state_t)f && legal[i].to == (patd_step_state_t)t;
            if (patd_step_state_legal((patd_step_state_t)f, (patd_step_state_t)t) != want)
                fail_msg("%s -> %s: legal=%d, want %d", patd_step_state_name(f),
                         patd_step_state_name(t),
                         patd_step_state_legal((patd_step_state_t)f, (patd_step_state_t)t), want);
            n_legal += (uint32_t)want;
        }
    assert_int_equal(n_legal, PAT_ARRAY_SIZE(legal));
    /* out of range is never legal; every state has its own name */
    assert_false(patd_step_state_legal(STEP_N_STATES, STEP_IDLE));
    assert_false(patd_step_state_legal(STEP_IDLE, (patd_step_state_t)-1));
    for (int a = 0; a < STEP_N_STATES; a++) {
        assert_string_not_equal(patd_step_state_name(a), "?");
        for (int b = a + 1; b < STEP_N_STATES; b++)
            assert_string_not_equal(patd_step_state_name(a), patd_step_state_name(b));
    }
    assert_string_equal(patd_step_state_name(STEP_N_STATES), "?");
    /* every state is reachable from IDLE and leads back to it */
    for (int s = 1; s < STEP_N_STATES; s++) {
        int into = 0, out = 0;
        for (int o = 0; o < STEP_N_STATES; o++) {
            into |= patd_step_state_legal((patd_step_state_t)o, (patd_step_state_t)s);
            out |= patd_step_state_legal((patd_step_state_t)s, (patd_step_state_t)o);
        }
        assert_true(into && out);
    }
}

/* ------------------------------------------------------------------ config */
static char cfg_path[64];

static void write_cfg(const char *text)
{
    FILE *f = fopen(cfg_path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int load(patd_config_t *c, int argc, const char **argv)
{
    return patd_config_load(c, argc, (char **)argv);
}

/* A reload as patd_main runs it, on one thread here: reread (the worker's part), then apply. */
static int reload(patd_config_t *c, int argc, const char **argv)
{
    static patd_config_t next;
    int rc = patd_config_reread(c, argc, (char **)argv, &next);
    return rc < 0 ? rc : patd_config_apply(c, &next);
}

static int cfg_setup(void **state)
{
    snprintf(cfg_path, sizeof(cfg_path), "/tmp/test_daemon_cfg.XXXXXX");
    int fd = mkstemp(cfg_path);
    assert_true(fd >= 0);
    close(fd);
    return 0;
}

static int cfg_teardown(void **state)
{
    unlink(cfg_path);
    return 0;
}

static void test_config_parse(void **state)
{
    patd_config_t c;
    const char *none[] = {"patd"};
    assert_int_equal(load(&c, 1, none), 0);
    assert_int_equal(c.max_conns, 64); /* the table's defaults */
    assert_int_equal(c.executors, 2);
    assert_string_equal(c.backend, "auto");
    assert_false(patd_config_was_set(&c, "max_conns"));

    write_cfg("[limits]\nmax_conns = 8\nlease_ms = 2000\n[daemon]\nlog_level = debug\n"
              "socket_mode = 0640\n[model]\ndtype = bf16\n");
    const char *with[] = {"patd", "--config", cfg_path, "--lease-ms=3000", "--executors", "3"};
    assert_int_equal(load(&c, 6, with), 0);
    assert_int_equal(c.max_conns, 8);
    assert_int_equal(c.lease_ms, 3000); /* the command line wins over the file */
    assert_int_equal(c.executors, 3);
    assert_int_equal(c.log_level, 7);
    assert_int_equal(atomic_load(&patd_log_level), 7); /* the apply hook ran at load */
    assert_int_equal(c.socket_mode, 0640);
    assert_true(patd_config_was_set(&c, "max_conns"));
    assert_true(patd_config_was_set(&c, "lease_ms"));

    /* refusals: each names the option; nothing runs */
    static const char *const bad_files[] = {
        "[limits]\nmax_conns = 0\n",            /* below its bound */
        "[limits]\nmax_conns = 4097\n",         /* above */
        "[limits]\nmax_conns = 12abc\n",        /* not a number */
        "[limits]\nmax_conns = -1\n",           /* negative */
        "[limits]\nno_such_key = 1\n",          /* unknown key */
        "[model]\nhead_dim = 96\n",             /* no kernel for it (cross-option rule) */
        "[model]\nq_heads = 8\nkv_heads = 3\n", /* not a divisor */
        "[daemon]\nbackend = tpu\n",
        "[gpu]\nforward = fast\n",
        "[daemon]\nname = ../etc\n",
        "[limits]\nconn_max_blocks = 5000\n[pool]\nblocks = 4096\n",
        "[daemon]\nlog_level = loud\n",
        "[limits\nmax_conns = 8\n", /* syntax */
    };
    const char *argv[] = {"patd", "--config", cfg_path};
    for (size_t i = 0; i < PAT_ARRAY_SIZE(bad_files); i++) {
        write_cfg(bad_files[i]);
        if (load(&c, 3, argv) != -EINVAL)
            fail_msg("accepted: %s", bad_files[i]);
    }
    const char *bad_args[][2] = {
        {"patd", "--max-conns=9999"}, {"patd", "--nope=1"},   {"patd", "stray"},
        {"patd", "--config"},         {"patd", "--lease-ms"},
    };
    for (size_t i = 0; i < PAT_ARRAY_SIZE(bad_args); i++)
        if (load(&c, 2, bad_args[i]) != -EINVAL)
            fail_msg("accepted argument %s", bad_args[i][1]);
    unlink("/tmp/test_daemon_no_such.ini");
    const char *missing[] = {"patd", "--config", "/tmp/test_daemon_no_such.ini"};
    assert_int_equal(load(&c, 3, missing), -EINVAL);
}

static void test_config_reload(void **state)
{
    patd_config_t c;
    write_cfg("[limits]\nmax_conns = 8\nlease_ms = 2000\n[pool]\nblocks = 4096\n"
              "[daemon]\nlog_level = info\n");
    const char *argv[] = {"patd", "--config", cfg_path, "--step-timeout-ms=777"};
    assert_int_equal(load(&c, 4, argv), 0);
    assert_int_equal(atomic_load(&patd_log_level), 6);

    /* a restart-only change: kept back; the rest applies, with its apply hook; the command line
     * still wins */
    write_cfg("[limits]\nmax_conns = 16\nlease_ms = 5000\nstep_timeout_ms = 50\n"
              "[pool]\nblocks = 8192\n[daemon]\nlog_level = debug\n");
    assert_int_equal(reload(&c, 4, argv), 1);
    assert_int_equal(c.max_conns, 16);
    assert_int_equal(c.blocks, 4096);
    assert_int_equal(c.lease_ms, 5000);
    assert_int_equal(c.log_level, 7);
    assert_int_equal(atomic_load(&patd_log_level), 7);
    assert_int_equal(c.step_timeout_ms, 777);

    /* lowering applies; so does raising again */
    write_cfg("[limits]\nmax_conns = 4\n[pool]\nblocks = 4096\n");
    assert_int_equal(reload(&c, 4, argv), 0);
    assert_int_equal(c.max_conns, 4);
    assert_int_equal(c.lease_ms, 10000); /* back to its default: the file no longer sets it */
    assert_int_equal(atomic_load(&patd_log_level), 6);
    write_cfg("[limits]\nmax_conns = 32\n[pool]\nblocks = 4096\n");
    assert_int_equal(reload(&c, 4, argv), 0);
    assert_int_equal(c.max_conns, 32);

    /* an invalid file changes nothing */
    patd_config_t before = c;
    write_cfg("[limits]\nmax_conns = 2\nlease_ms = 0\n");
    assert_int_equal(reload(&c, 4, argv), -EINVAL);
    assert_memory_equal(&c, &before, sizeof(c));
}

/* Only a regular file of at most PATD_CONFIG_MAX_BYTES is read, at start and at reload, the
 * instance's drop-in too: each other kind is refused, with its cause, without hanging, and a
 * reload refused leaves the running configuration as it was. */
static void test_config_files(void **state)
{
    patd_config_t c, next;
    write_cfg("[limits]\nmax_conns = 8\n");
    const char *argv[] = {"patd", "--config", cfg_path};
    assert_int_equal(load(&c, 3, argv), 0);
    assert_int_equal(c.max_conns, 8);
    const patd_config_t before = c;
    static const struct {
        const char *kind, *why;
    } kinds[] = {
        {"dir", "is a directory, not a regular file"},
        {"fifo", "is a FIFO, not a regular file"},
        {"devzero", "is a character device, not a regular file"},
        {"big", "is larger than 1048576 bytes"},
        {"nul", "holds a NUL byte"},
        {"missing", "cannot open config"},
    };
    for (size_t i = 0; i < PAT_ARRAY_SIZE(kinds); i++) {
        const char *k = kinds[i].kind;
        unlink(cfg_path);
        if (!strcmp(k, "dir")) {
            assert_int_equal(mkdir(cfg_path, 0700), 0);
        } else if (!strcmp(k, "fifo")) {
            assert_int_equal(mkfifo(cfg_path, 0600), 0);
        } else if (!strcmp(k, "devzero")) {
            assert_int_equal(symlink("/dev/zero", cfg_path), 0);
        } else if (!strcmp(k, "big")) { /* a valid file, one byte past the cap */
            FILE *f = fopen(cfg_path, "w");
            assert_non_null(f);
            fputs("[limits]\nmax_conns = 3\n", f);
            for (long n = 22; n <= (long)PATD_CONFIG_MAX_BYTES; n++)
                fputc(n % 64 ? '#' : '\n', f);
            fclose(f);
        } else if (!strcmp(k, "nul")) {
            FILE *f = fopen(cfg_path, "w");
            assert_non_null(f);
            fwrite("[limits]\nmax_conns = 3\n\0\n", 1, 25, f);
            fclose(f);
        }
        int rc = patd_config_reread(&c, 3, (char **)argv, &next);
        if (rc != -EINVAL || !strstr(next.error, kinds[i].why))
            fail_msg("%s: reread %d, '%s'", k, rc, next.error);
        assert_memory_equal(&c, &before, sizeof(c));
        patd_config_t fresh;
        memset(&fresh, 0, sizeof(fresh));
        rc = load(&fresh, 3, argv); /* a start says the same and stops */
        if (rc != -EINVAL || !strstr(fresh.error, kinds[i].why))
            fail_msg("%s: start %d, '%s'", k, rc, fresh.error);
        rmdir(cfg_path);
        unlink(cfg_path);
    }
    /* the drop-in of --instance 1, <path>@1.conf: absent is fine; present, read by the same rule */
    write_cfg("[limits]\nmax_conns = 8\n");
    char dropin[96];
    snprintf(dropin, sizeof(dropin), "%s@1.conf", cfg_path);
    const char *inst[] = {"patd", "--config", cfg_path, "--instance", "1"};
    assert_int_equal(load(&c, 5, inst), 0);
    assert_false(c.dropin_read);
    assert_int_equal(mkdir(dropin, 0700), 0);
    assert_int_equal(load(&c, 5, inst), -EINVAL);
    assert_non_null(strstr(c.error, "is a directory, not a regular file"));
    rmdir(dropin);
    FILE *f = fopen(dropin, "w");
    assert_non_null(f);
    fputs("[limits]\nmax_conns = 5\n", f);
    fclose(f);
    assert_int_equal(load(&c, 5, inst), 0);
    assert_true(c.dropin_read);
    assert_int_equal(c.max_conns, 5);
    assert_string_equal(c.error, "");
    unlink(dropin);
}

/* ------------------------------------------------------------------ watchdog */
/* The watchdog's judgement on a simulated minute: four idle executors beating every 100 ms from
 * random phases, each beat up to 15 ms late, checked every 100 ms (up to 15 ms late) under
 * WatchdogSec=200ms: never stuck (half the period alone, 100 ms, called them stuck at start and at
 * drain). Then one executor stops beating: stuck within the threshold and two checks, and no
 * executor is stuck while the executors are stopping. */
static void test_watchdog_sim(void **state)
{
    const uint64_t ms = 1000000ull, idle = 100 * ms, tick = 100 * ms;
    tl_rng_t r;
    tl_rng_seed(&r, 31);
    for (int round = 0; round < 20; round++) {
        patd_watchdog_t w;
        patd_watchdog_init(&w, 200 * ms, idle, tick);
        uint64_t next_beat[4], beats[4] = {0, 0, 0, 0};
        for (int i = 0; i < 4; i++)
            next_beat[i] = tl_rng_below(&r, 100) * ms;
        const uint64_t stall_at = 40000 * ms;
        uint64_t found = 0;
        for (uint64_t j = 1; j <= 600; j++) {
            const uint64_t now = j * tick + tl_rng_below(&r, 16) * ms;
            for (int i = 0; i < 4; i++)
                while (next_beat[i] <= now && !(i == 2 && next_beat[i] >= stall_at)) {
                    beats[i]++;
                    next_beat[i] += idle + tl_rng_below(&r, 16) * ms;
                }
            const uint32_t stuck = patd_watchdog_check(&w, beats, 4, now, 0);
            if (now < stall_at)
                assert_int_equal(stuck, 0);
            else if (stuck && !found)
                found = now;
            assert_int_equal(patd_watchdog_check(&w, beats, 4, now, 1), 0); /* stopping */
        }
        assert_true(found > stall_at);
        assert_true(found <= stall_at + w.stuck_ns + 2 * tick + 32 * ms);
    }
}

/* The descriptor store's two sides as systemd speaks them (issue 37): FDSTORE=1 + FDNAME + the
 * descriptors by SCM_RIGHTS to $NOTIFY_SOCKET, then LISTEN_PID / LISTEN_FDS / LISTEN_FDNAMES at
 * the next start. */
static void test_fd_store_protocol(void **state)
{
    (void)state;
    char dir[] = "/tmp/patd-fdstore.XXXXXX", path[96];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/notify", dir);
    int srv = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    assert_int_equal(bind(srv, (struct sockaddr *)&a, sizeof(a)), 0);
    setenv("NOTIFY_SOCKET", path, 1);
    patd_notify_t n;
    assert_int_equal(patd_notify_open(&n), 0);
    int mfd = memfd_create("patd-test-pool", MFD_CLOEXEC);
    assert_true(mfd >= 0);
    assert_int_equal(write(mfd, "kept", 4), 4);
    assert_int_equal(patd_notify_fds(&n, "patd-pool", &mfd, 1), 0);
    assert_int_equal(patd_notify_fds(&n, "bad:name", &mfd, 1), -EINVAL);
    assert_int_equal(patd_notify_fds(&n, "patd-pool", &mfd, 0), -EINVAL);
    char buf[256] = {0};
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof(ctl.b)};
    assert_true(recvmsg(srv, &m, 0) > 0);
    assert_string_equal(buf, "FDSTORE=1\nFDNAME=patd-pool");
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    assert_non_null(c);
    assert_int_equal(c->cmsg_type, SCM_RIGHTS);
    int got;
    memcpy(&got, CMSG_DATA(c), sizeof(int));
    char back[8] = {0};
    assert_int_equal(pread(got, back, 4, 0), 4); /* the same memory, through the manager's fd */
    assert_string_equal(back, "kept");
    patd_notify_close(&n);
    /* the next start: the stored descriptors at 3 and 4, named; only for LISTEN_PID's process */
    pid_t pid = fork();
    if (pid == 0) {
        int idx = memfd_create("patd-test-index", 0);
        if (dup2(got, 3) != 3 || dup2(idx, 4) != 4)
            _exit(10);
        char me[32];
        snprintf(me, sizeof(me), "%d", (int)getpid());
        setenv("LISTEN_FDS", "2", 1);
        setenv("LISTEN_FDNAMES", "patd-pool:patd-index", 1);
        setenv("LISTEN_PID", "1", 1); /* another process's: not ours */
        patd_listen_fd_t fds[4];
        if (patd_listen_fds(fds, 4) != 0 || getenv("LISTEN_FDS"))
            _exit(11);
        setenv("LISTEN_FDS", "2", 1);
        setenv("LISTEN_FDNAMES", "patd-pool:patd-index", 1);
        setenv("LISTEN_PID", me, 1);
        if (patd_listen_fds(fds, 4) != 2 || fds[0].fd != 3 || fds[1].fd != 4 ||
            strcmp(fds[0].name, "patd-pool") || strcmp(fds[1].name, "patd-index") ||
            getenv("LISTEN_PID") || !(fcntl(3, F_GETFD) & FD_CLOEXEC))
            _exit(12);
        char b2[8] = {0};
        _exit(pread(3, b2, 4, 0) == 4 && !strcmp(b2, "kept") ? 0 : 13);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    close(got);
    close(mfd);
    close(srv);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_moves),
        cmocka_unit_test_setup_teardown(test_config_parse, cfg_setup, cfg_teardown),
        cmocka_unit_test_setup_teardown(test_config_reload, cfg_setup, cfg_teardown),
        cmocka_unit_test_setup_teardown(test_config_files, cfg_setup, cfg_teardown),
        cmocka_unit_test(test_watchdog_sim),
        cmocka_unit_test(test_fd_store_protocol),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
