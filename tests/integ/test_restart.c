/*
 * test_restart.c — the cache survives the daemon (issue 37, pool.persist) on the cpu backend,
 * with the test as the service manager exactly as systemd speaks to patd (tl_daemon_start_managed:
 * $NOTIFY_SOCKET, FDSTORE=1 / FDNAME= / FDSTOREREMOVE=1 with the descriptors, and at each restart
 * LISTEN_PID / LISTEN_FDS / LISTEN_FDNAMES):
 *   - kill -9 after prefills, restart: every block published before the kill is adopted; a new
 *     session's open of the same prompts is served from the cache (as many tokens as before the
 *     kill), and its decode steps, which read the adopted KV, match float64; the old session
 *     learns of the restart (ESTALE) and reconnects;
 *   - a torn index (its header overwritten), another model shape, another pool geometry: each
 *     start is cold, its log line says why, and the store then holds the new run's pool and
 *     index, not the stale ones (the block size is checked as the geometry is; this build
 *     serves 16-token blocks only, so test_kv's index test changes it);
 *   - an fp8 pool (model.kv_dtype): adopted by the same fp8 config, never by a 16-bit one or
 *     one of another kv_scale, nor a 16-bit pool by an fp8 config;
 *   - 30 kill -9 / restart cycles with steps between: nothing leaks (the store keeps two
 *     descriptors, the pool check passes, the cache keeps what was published);
 *   - 12 kills at random instants while a client steps (mid-step too): after each restart every
 *     family of prompts whose step ended before the kill is served whole from the cache, and
 *     every row the client checks against float64 stays right; the same in a pool so small that
 *     blocks are evicted and reused all along (each family then hits a prefix of any length),
 *     the pool's check passing after every restart;
 *   - without systemd: patd-keep starts patd again after a kill -9 with the store, the prompts
 *     hit, and SIGTERM to the keeper drains patd and ends both with status 0;
 *   - patctl upgrade (PAT_ADMIN_UPGRADE): the binary at patd's path starts as a successor while
 *     patd serves, takes over once ready (MAINPID= names it to the manager), adopts the cache,
 *     and a stepping client reconnects once with every checked row right; the old daemon exits
 *     0 and nothing but the pool's two descriptors is carried over;
 *   - patctl upgrade to a binary that fails: patctl says so, the old daemon serves on and says
 *     why; a good binary at the same path then upgrades (a second upgrade meanwhile: EALREADY);
 *   - patd-keep follows an upgrade's successor (SIGUSR2) and ends it at SIGTERM.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "pat.h"
#include "pat_base.h"
#include "tl_client.h"
#include "tl_daemon.h"

static const pat_model_t MODEL = {4, 8, 2, 64, PAT_F16, 16, 0};
static const char *const ARGS[] = {"--backend=cpu", "--blocks=256", "--executors=2", NULL};

static pat_conn_t *connect_to(tl_daemon_t *d)
{
    pat_conn_t *c = NULL;
    char why[256];
    int rc = tl_connect(d->sock, &MODEL, "test_restart", 512, 10000, &c, why, sizeof(why));
    if (rc < 0)
        fail_msg("connect: %s: %s", pat_strerror(rc), why);
    return c;
}

/* Two prompts sharing 64 tokens, 40 of their own each (prompt `base`). */
static void prompts(tl_seq_t s[2], uint32_t base)
{
    for (int i = 0; i < 2; i++) {
        tl_seq_init(&s[i]);
        for (uint32_t t = 0; t < 64; t++)
            tl_seq_push(&s[i], base + t);
        for (uint32_t t = 0; t < 40; t++)
            tl_seq_push(&s[i], base + 1000 + 100 * (uint32_t)i + t);
    }
}

/* Opens both, prefills them and decodes `decodes` tokens, every row checked against float64
 * unless !check (an fp8 pool's rows are not within that check's bound for fp16 KV); returns the
 * tokens the cache served at open. */
static uint32_t run_steps(pat_conn_t *c, tl_seq_t s[2], int decodes, tl_rng_t *r, int check)
{
    uint32_t cached = 0;
    tl_seq_t *ps[2] = {&s[0], &s[1]};
    for (int i = 0; i < 2; i++) {
        if (tl_seq_open(c, &s[i]) < 0)
            fail_msg("open: %s", pat_last_error(c));
        cached += s[i].cached;
    }
    for (int k = 0; k <= decodes; k++) {
        tl_step_result_t res;
        if (tl_client_step(c, &MODEL, ps, 2, r, check, &res) < 0)
            fail_msg("step %d: %s", k, pat_last_error(c));
        assert_true(!check || res.worst < 2e-2);
        for (int i = 0; i < 2; i++)
            tl_seq_push(&s[i], 7 + (uint32_t)k);
    }
    return cached;
}

static uint32_t run(pat_conn_t *c, tl_seq_t s[2], int decodes, tl_rng_t *r)
{
    return run_steps(c, s, decodes, r, 1);
}

/* The two pairs of sequences a test stepped, freed, and its daemon stopped. */
static void finish(tl_daemon_t *d, tl_seq_t a[2], tl_seq_t b[2])
{
    for (int i = 0; i < 2; i++) {
        tl_seq_done(&a[i]);
        tl_seq_done(&b[i]);
    }
    tl_daemon_stop(d);
}

static int log_has(tl_daemon_t *d, const char *what)
{
    FILE *f = fopen(d->log, "r");
    if (!f)
        return 0;
    char line[1024];
    int found = 0;
    while (!found && fgets(line, sizeof(line), f))
        found = strstr(line, what) != NULL;
    fclose(f);
    return found;
}

static int stored(tl_daemon_t *d, const char *name)
{
    int n = 0;
    for (int i = 0; i < d->store.n; i++)
        n += !strcmp(d->store.name[i], name);
    return n;
}

static void kill_restart(tl_daemon_t *d, const char *const *args)
{
    assert_true(tl_daemon_signal_wait(d, SIGKILL, 5000) >= 0);
    /* a new log per start: what the last one said is kept beside it */
    char old[220];
    snprintf(old, sizeof(old), "%s.prev", d->log);
    rename(d->log, old);
    assert_int_equal(tl_daemon_restart(d, args), 0);
    assert_int_equal(stored(d, "patd-pool"), 1);
    assert_int_equal(stored(d, "patd-index"), 1);
}

static void test_kill_restart_adopts(void **state)
{
    (void)state;
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start_managed(&d, ARGS), 0);
    assert_int_equal(stored(&d, "patd-pool"), 1);
    assert_int_equal(stored(&d, "patd-index"), 1);
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x37));
    pat_conn_t *c = connect_to(&d);
    tl_seq_t s[2];
    prompts(s, 500);
    assert_int_equal(run(c, s, 3, &r), 0); /* cold: nothing cached */
    const int64_t cached_blocks = tl_daemon_status(&d, "blocks_used");
    kill_restart(&d, ARGS);
    assert_true(log_has(&d, "pool.persist: adopted"));
    /* every published block came back: the prompts' full blocks and the decodes' */
    const int64_t adopted = tl_daemon_status(&d, "blocks_cached");
    printf("kill -9 with %lld blocks in use: %lld cached blocks adopted\n",
           (long long)cached_blocks, (long long)adopted);
    assert_true(adopted >= 64 / 16 + 2 * (104 / 16 - 64 / 16));
    /* the old session is gone with its daemon */
    uint32_t sq, cq;
    const uint32_t tok[1] = {1};
    assert_true(pat_seq_open(c, tok, 1, &sq, &cq) < 0);
    pat_close(c);
    c = connect_to(&d);
    tl_seq_t t[2];
    prompts(t, 500);
    const uint32_t hit = run(c, t, 2, &r);
    printf("after the restart: %u of %u prompt tokens from the cache\n", hit, 2 * 104);
    assert_int_equal(hit, 2 * (104 / 16) * 16);
    char *out = NULL;
    assert_int_equal(pat_admin(d.sock, PAT_ADMIN_CHECK, 5000, &out), 0);
    assert_non_null(strstr(out, "ok"));
    pat_free(out);
    pat_close(c);
    finish(&d, s, t);
}

/* An fp8 pool (model.kv_dtype) across kill -9: a 16-bit pool is never adopted as fp8 (nor the
 * reverse), an fp8 pool is adopted by the same fp8 config, and one of another kv_scale is not
 * (its bytes mean other values). */
static void test_fp8_pool_restarts(void **state)
{
    (void)state;
    static const char *const fp8[] = {"--backend=cpu", "--blocks=256", "--kv-dtype=fp8_e4m3",
                                      "--kv-scale=0.25", NULL};
    static const char *const fp8_other[] = {"--backend=cpu", "--blocks=256", "--kv-dtype=fp8_e4m3",
                                            "--kv-scale=0.5", NULL};
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start_managed(&d, ARGS), 0);
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x3a));
    pat_conn_t *c = connect_to(&d);
    tl_seq_t s[2], t[2], u[2];
    prompts(s, 700);
    run(c, s, 1, &r); /* published in an f16 pool */
    pat_close(c);
    kill_restart(&d, fp8);
    assert_true(log_has(&d, "the cache starts empty: another model"));
    assert_int_equal(tl_daemon_status(&d, "blocks_cached"), 0);
    c = connect_to(&d);
    prompts(t, 700);
    assert_int_equal(run_steps(c, t, 1, &r, 0), 0);
    pat_close(c);
    kill_restart(&d, fp8);
    assert_true(log_has(&d, "pool.persist: adopted"));
    assert_true(tl_daemon_status(&d, "blocks_cached") >= 64 / 16);
    c = connect_to(&d);
    prompts(u, 700);
    const uint32_t hit = run_steps(c, u, 1, &r, 0);
    printf("fp8 pool after kill -9: %u of %u prompt tokens from the cache\n", hit, 2 * 104);
    assert_int_equal(hit, 2 * (104 / 16) * 16);
    pat_close(c);
    kill_restart(&d, fp8_other);
    assert_true(log_has(&d, "the cache starts empty: another model"));
    kill_restart(&d, ARGS);
    assert_true(log_has(&d, "the cache starts empty: another model"));
    for (int i = 0; i < 2; i++)
        tl_seq_done(&u[i]);
    finish(&d, s, t);
}

static void test_cold_starts(void **state)
{
    (void)state;
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start_managed(&d, ARGS), 0);
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x38));
    pat_conn_t *c = connect_to(&d);
    tl_seq_t s[2];
    prompts(s, 900);
    run(c, s, 1, &r);
    pat_close(c);
    /* a torn index: its header overwritten while the daemon is dead */
    assert_true(tl_daemon_signal_wait(&d, SIGKILL, 5000) >= 0);
    tl_daemon_collect(&d);
    for (int i = 0; i < d.store.n; i++)
        if (!strcmp(d.store.name[i], "patd-index"))
            assert_int_equal(pwrite(d.store.fd[i], "garbage!", 8, 0), 8);
    char old[220];
    snprintf(old, sizeof(old), "%s.prev", d.log);
    rename(d.log, old);
    assert_int_equal(tl_daemon_restart(&d, ARGS), 0);
    assert_true(log_has(&d, "the cache starts empty: not a patd cache index"));
    assert_int_equal(tl_daemon_status(&d, "blocks_cached"), 0);
    assert_int_equal(stored(&d, "patd-pool"), 1); /* the new run's, the stale ones removed */
    assert_int_equal(stored(&d, "patd-index"), 1);
    /* another model shape (the client's model no longer matches: nothing connects) */
    static const char *const two_layers[] = {"--backend=cpu", "--blocks=256", "--layers=2", NULL};
    c = connect_to(&d);
    tl_seq_t t[2];
    prompts(t, 900);
    run(c, t, 1, &r);
    pat_close(c);
    kill_restart(&d, two_layers);
    assert_true(log_has(&d, "the cache starts empty: another model"));
    assert_int_equal(tl_daemon_status(&d, "blocks_cached"), 0);
    /* another pool geometry, after a run that published under the first (the block size is
     * checked the same way, but this build serves 16 only: kv_index's own test changes it) */
    kill_restart(&d, ARGS);
    c = connect_to(&d);
    tl_seq_t u[2];
    prompts(u, 900);
    run(c, u, 1, &r);
    pat_close(c);
    static const char *const smaller[] = {"--backend=cpu", "--blocks=128", NULL};
    kill_restart(&d, smaller);
    assert_true(log_has(&d, "the cache starts empty: another pool geometry"));
    assert_int_equal(tl_daemon_status(&d, "blocks_cached"), 0);
    /* and back: the store holds the 128-block run's pool now, so this start is cold too */
    kill_restart(&d, ARGS);
    assert_true(log_has(&d, "the cache starts empty: another pool geometry"));
    for (int i = 0; i < 2; i++) {
        tl_seq_done(&s[i]);
        tl_seq_done(&t[i]);
        tl_seq_done(&u[i]);
    }
    tl_daemon_stop(&d);
}

/* The child of test_random_kills: steps families of prompts through whatever daemon answers,
 * every row checked against float64 (tl_client's KV is a function of the prefix, so a wrong
 * adopted block fails the check), and tells the parent each family whose step ended ("F n") or
 * a check that failed ("BAD"). Reconnects when the daemon goes; exits when out is closed. */
static void stepper(tl_daemon_t *d, int out, uint64_t seed)
{
    tl_rng_t r;
    tl_rng_seed(&r, seed);
    for (;;) {
        pat_conn_t *c = NULL;
        char why[256];
        if (tl_connect(d->sock, &MODEL, "stepper", 512, 2000, &c, why, sizeof(why)) < 0) {
            usleep(10000);
            continue;
        }
        for (;;) {
            const uint32_t fam = tl_rng_below(&r, 6);
            tl_seq_t s[2];
            prompts(s, 3000 + 300 * fam);
            tl_seq_t *ps[2] = {&s[0], &s[1]};
            int rc = tl_seq_open(c, &s[0]);
            if (rc == 0)
                rc = tl_seq_open(c, &s[1]);
            tl_step_result_t res;
            for (int k = 0; rc == 0 && k < 2; k++) {
                rc = tl_client_step(c, &MODEL, ps, 2, &r, 1, &res);
                if (rc == -EIO && res.worst >= 1e-2) { /* tl_client's bound */
                    dprintf(out, "BAD %u %g\n", fam, res.worst);
                    _exit(2);
                }
                for (int i = 0; i < 2; i++)
                    tl_seq_push(&s[i], 5);
            }
            if (rc == 0 && dprintf(out, "F %u %llu\n", fam, (unsigned long long)pat_now_ns()) < 0)
                _exit(0); /* the parent is done */
            for (int i = 0; i < 2; i++) {
                if (rc == 0)
                    pat_seq_close(c, s[i].seq);
                tl_seq_done(&s[i]);
            }
            if (rc < 0)
                break; /* the daemon went: reconnect */
        }
        pat_close(c);
    }
}

/* A stepper in a child process: its lines come on the returned stream (non-blocking: never
 * waits for the next line). */
static FILE *stepper_start(tl_daemon_t *d, uint64_t seed, int nonblock, pid_t *ret_kid)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t kid = fork();
    if (kid == 0) {
        close(p[0]);
        stepper(d, p[1], seed);
        _exit(0);
    }
    close(p[1]);
    if (nonblock)
        fcntl(p[0], F_SETFL, O_NONBLOCK);
    *ret_kid = kid;
    return fdopen(p[0], "r");
}

/* kill -9 at random instants while a client steps, 12 times. Without evictions (the pool holds
 * every family): after each restart every family whose step ended before the kill is served
 * whole from the cache. With them (a pool of 40 blocks for six families of 10, all six stepped
 * once before the stepper starts, so the pool is full from the first kill on and blocks are
 * evicted and reused all along, the index following): each family opens with a prefix of its
 * blocks, any length. (Asserting evictions between the kills instead failed on CI's ASan build,
 * where one step ends between two kills.) Either way the client's every checked row stays right (a
 * block adopted with another's KV would fail float64) and the pool's check passes after each
 * restart. */
static void random_kills(const char *const *args, int evicting)
{
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start_managed(&d, args), 0);
    int64_t evictions = 0, hit_tokens = 0;
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x3a));
    int64_t fill_evictions = 0;
    if (evicting) {
        /* every family stepped once first: 6 x 10 blocks into 40 evict, whatever the build's
         * speed, and the stepper starts in a full pool (each new block of it an eviction) */
        pat_conn_t *c = connect_to(&d);
        for (uint32_t f = 0; f < 6; f++) {
            tl_seq_t s[2];
            prompts(s, 3000 + 300 * f);
            run_steps(c, s, 1, &r, 1);
            for (int i = 0; i < 2; i++) {
                pat_seq_close(c, s[i].seq);
                tl_seq_done(&s[i]);
            }
        }
        pat_close(c);
        fill_evictions = tl_daemon_metric(&d, "patd_kv_evictions_total");
        if (fill_evictions <= 0)
            fail_msg("six families in a pool of 40 blocks: %lld evictions",
                     (long long)fill_evictions);
    }
    pid_t kid;
    FILE *in = stepper_start(&d, tl_rng_u64(&r), 1, &kid);
    int done[6] = {0}, steps = 0, kills = 0;
    char line[64];
    for (kills = 0; kills < 12; kills++) {
        /* the client's first step after the last restart (a slow build's restart takes longer
         * than the random wait alone), then a random instant within the next 250 ms */
        const int before = steps;
        uint64_t until = pat_now_ns() + 20000000000ull, kill_at = 0;
        for (;;) {
            while (fgets(line, sizeof(line), in)) {
                if (!strncmp(line, "BAD", 3))
                    fail_msg("a checked row went wrong after a restart: %s", line);
                unsigned f;
                if (sscanf(line, "F %u", &f) == 1 && f < 6) {
                    done[f] = 1;
                    steps++;
                }
            }
            clearerr(in);
            const uint64_t now = pat_now_ns();
            if (!kill_at && steps > before)
                kill_at = now + 1000000ull * tl_rng_below(&r, 250);
            if (kill_at && now >= kill_at)
                break;
            if (now > until)
                fail_msg("no step ended within 20 s of restart %d", kills);
            usleep(2000);
        }
        const int64_t ev = tl_daemon_metric(&d, "patd_kv_evictions_total");
        evictions += ev > 0 ? ev : 0;
        kill_restart(&d, args);
        assert_int_equal(tl_daemon_status(&d, "pool_check"), 0);
        pat_conn_t *c = connect_to(&d);
        for (uint32_t f = 0; f < 6; f++) {
            if (!done[f])
                continue;
            tl_seq_t s[2];
            prompts(s, 3000 + 300 * f);
            for (int i = 0; i < 2; i++) {
                assert_int_equal(tl_seq_open(c, &s[i]), 0);
                hit_tokens += s[i].cached;
                if (!evicting && s[i].cached != (104 / 16) * 16)
                    fail_msg("family %u, published before kill %d, hit %u tokens", f, kills,
                             s[i].cached);
                assert_true(s[i].cached % 16 == 0 && s[i].cached <= (104 / 16) * 16);
                pat_seq_close(c, s[i].seq);
                tl_seq_done(&s[i]);
            }
        }
        pat_close(c);
    }
    usleep(200000);
    while (fgets(line, sizeof(line), in))
        if (!strncmp(line, "BAD", 3))
            fail_msg("a checked row went wrong after a restart: %s", line);
    fclose(in);
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    int fams = 0;
    for (int f = 0; f < 6; f++)
        fams += done[f];
    if (evicting)
        printf("%d kills at random instants in a pool that evicts (%lld evictions filling it, "
               "%lld more between the kills): %d checked steps ended between them, %lld prompt "
               "tokens from the cache after the restarts, every checked row right\n",
               kills, (long long)fill_evictions, (long long)(evictions - fill_evictions), steps,
               (long long)hit_tokens);
    else
        printf("%d kills at random instants: %d checked steps ended between them, %d families "
               "served whole from the cache after each\n",
               kills, steps, fams);
    assert_true(steps > 0 && fams > 0);
    if (evicting)
        assert_true(hit_tokens > 0);
    char *out = NULL;
    assert_int_equal(pat_admin(d.sock, PAT_ADMIN_CHECK, 5000, &out), 0);
    assert_non_null(strstr(out, "ok"));
    pat_free(out);
    tl_daemon_stop(&d);
}

static void test_random_kills(void **state)
{
    (void)state;
    random_kills(ARGS, 0);
}

static void test_random_kills_evicting(void **state)
{
    (void)state;
    static const char *const small[] = {"--backend=cpu", "--blocks=40", "--executors=2", NULL};
    random_kills(small, 1);
}

static void test_restart_cycles(void **state)
{
    (void)state;
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start_managed(&d, ARGS), 0);
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x39));
    const int fds0 = tl_open_fds();
    int64_t last = 0;
    const int cycles = 30;
    uint64_t t_kill = 0, worst_ns = 0, sum_ns = 0; /* kill -9 to the first step served after */
    for (int k = 0; k < cycles; k++) {
        pat_conn_t *c = connect_to(&d);
        tl_seq_t s[2];
        prompts(s, 2000 + 300 * (uint32_t)(k % 5)); /* five families, each seen again */
        const uint32_t hit = run(c, s, 1, &r);
        if (t_kill) {
            const uint64_t ns = pat_now_ns() - t_kill;
            sum_ns += ns;
            worst_ns = ns > worst_ns ? ns : worst_ns;
        }
        if (k >= 5) /* its family was published before a kill: served from the cache */
            assert_true(hit >= 2 * (104 / 16) * 16);
        pat_close(c);
        for (int i = 0; i < 2; i++)
            tl_seq_done(&s[i]);
        t_kill = pat_now_ns();
        kill_restart(&d, ARGS);
        last = tl_daemon_status(&d, "blocks_cached");
        assert_true(last > 0);
    }
    char *out = NULL;
    assert_int_equal(pat_admin(d.sock, PAT_ADMIN_CHECK, 5000, &out), 0);
    assert_non_null(strstr(out, "ok"));
    pat_free(out);
    printf("%d kill -9 / restart cycles: %lld blocks cached at the end, the test's descriptors "
           "%d -> %d; kill -9 to the next served step (restart, reconnect, prefill from the "
           "cache, a decode): mean %.0f ms, worst %.0f ms (measured, not a bound)\n",
           cycles, (long long)last, fds0, tl_open_fds(), sum_ns / 1e6 / (cycles - 1),
           worst_ns / 1e6);
    assert_int_equal(tl_open_fds(), fds0);
    tl_daemon_stop(&d);
}

/* Open descriptors of process pid. */
static int proc_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    int n = 0;
    for (struct dirent *e; dir && (e = readdir(dir));)
        n += e->d_name[0] != '.';
    if (dir)
        closedir(dir);
    return n;
}

/* Reads the stepper's lines until `after` steps ended after t_from (0: none yet); the longest
 * gap between two steps from t_from on is returned. Fails on a wrong row. */
static uint64_t steps_until(FILE *in, int after, uint64_t t_from)
{
    char line[96];
    uint64_t last = 0, gap = 0;
    int n = 0;
    while (n < after && fgets(line, sizeof(line), in)) {
        if (!strncmp(line, "BAD", 3))
            fail_msg("a checked row went wrong across the upgrade: %s", line);
        unsigned f;
        unsigned long long t;
        if (sscanf(line, "F %u %llu", &f, &t) != 2)
            continue;
        if (last && t > t_from && t - last > gap)
            gap = t - last;
        last = t;
        n += t > t_from;
    }
    if (n < after)
        fail_msg("the stepper stopped after %d steps", n);
    return gap;
}

/* A line of the STATUS text ("key value"): its integer value, or -1 when absent. */
static int64_t status_line(tl_daemon_t *d, const char *key)
{
    char *out = NULL;
    int64_t v = -1;
    if (pat_admin(d->sock, PAT_ADMIN_STATUS, 2000, &out) == 0) {
        const size_t n = strlen(key);
        for (const char *p = out; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
            if (!strncmp(p, key, n) && p[n] == ' ')
                v = strtoll(p + n + 1, NULL, 10);
    }
    pat_free(out);
    return v;
}

/* Polls STATUS (every 25 ms, tries times) until a daemon other than pid `old` answers; its pid,
 * or -1. */
static int64_t status_pid_other(tl_daemon_t *d, int64_t old, int tries)
{
    int64_t pid = -1;
    for (int i = 0; i < tries && (pid < 0 || pid == old); i++) {
        usleep(25000);
        pid = tl_daemon_status(d, "pid");
    }
    return pid == old ? -1 : pid;
}

/* Polls STATUS until its pid is `pid` (5 s); 0 or -1. */
static int status_pid_is(tl_daemon_t *d, int64_t pid)
{
    for (int i = 0; i < 500; i++) {
        if (tl_daemon_status(d, "pid") == pid)
            return 0;
        usleep(10000);
    }
    return -1;
}

/* patctl upgrade (PAT_ADMIN_UPGRADE) while a client steps: the successor starts beside the
 * serving daemon, takes over once ready, adopts the cache, and the client's every checked row
 * stays right; the longest gap between its served steps is printed (issue 37's target is
 * <= 100 ms; measured here, not bound). */
static void test_upgrade(void **state)
{
    (void)state;
    tl_daemon_t d;
    assert_int_equal(tl_daemon_start_managed(&d, ARGS), 0);
    const pid_t old = d.pid;
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x3c));
    pat_conn_t *c = connect_to(&d);
    tl_seq_t s[2];
    prompts(s, 8000);
    run(c, s, 1, &r);
    pat_close(c);
    usleep(100000); /* the session's close is the daemon's */
    const int fds_before = proc_fds(old);
    pid_t kid;
    FILE *in = stepper_start(&d, tl_rng_u64(&r), 0, &kid);
    steps_until(in, 20, 0);
    const uint64_t t_up = pat_now_ns();
    char *out = NULL;
    assert_int_equal(pat_admin(d.sock, PAT_ADMIN_UPGRADE, 5000, &out), 0);
    int succ = 0;
    assert_int_equal(sscanf(out, "upgrading: pid %d", &succ), 1);
    pat_free(out);
    const uint64_t gap = steps_until(in, 20, t_up);
    fclose(in);
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    int st = 0;
    assert_int_equal(waitpid(old, &st, 0), old); /* handed over, then exited 0 */
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    tl_daemon_collect(&d); /* MAINPID= named the successor */
    assert_int_equal(d.pid, succ);
    assert_int_equal(status_pid_is(&d, succ), 0);
    assert_true(log_has(&d, "upgrade: taking over"));
    assert_true(log_has(&d, "pool.persist: adopted"));
    assert_int_equal(stored(&d, "patd-pool"), 1);
    assert_int_equal(stored(&d, "patd-index"), 1);
    c = connect_to(&d);
    tl_seq_t t[2];
    prompts(t, 8000);
    const uint32_t hit = run(c, t, 1, &r);
    printf("upgrade (patctl upgrade): pid %d -> %d, %u of %u prompt tokens from the cache; the "
           "stepping client's longest gap between served steps %.1f ms (20 steps before, 20 "
           "after)\n",
           (int)old, succ, hit, 2 * 104, gap / 1e6);
    assert_int_equal(hit, 2 * (104 / 16) * 16);
    pat_close(c);
    usleep(100000);
    printf("the daemon's descriptors: %d before the upgrade, %d in its successor\n", fds_before,
           proc_fds(succ));
    assert_true(proc_fds(succ) <= fds_before); /* nothing carried over but the pool's two */
    finish(&d, s, t);
}

/* Puts `what` (a file) at path by a rename, as a package manager installs a binary. */
static void install(const char *what, const char *path)
{
    char tmp[300], cmd[700];
    snprintf(tmp, sizeof(tmp), "%s.new", path);
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s' && chmod 755 '%s'", what, tmp, tmp);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(rename(tmp, path), 0);
}

/* A tool beside the patd binary the tests run (build/bin/NAME). */
static void tool_path(const char *name, char *out, size_t len)
{
    const char *patd = getenv("PATD_BIN") ? getenv("PATD_BIN") : "build/bin/patd";
    snprintf(out, len, "%s", patd);
    char *slash = strrchr(out, '/');
    snprintf(slash ? slash + 1 : out, len - (size_t)(slash ? slash + 1 - out : 0), "%s", name);
}

/* Runs `patctl --socket S upgrade`, its output (both streams) into out; its exit status. */
static int patctl_upgrade(tl_daemon_t *d, char *out, size_t len, FILE **bg)
{
    char patctl[300], cmd[700];
    tool_path("patctl", patctl, sizeof(patctl));
    snprintf(cmd, sizeof(cmd), "%s --socket %s upgrade 2>&1", patctl, d->sock);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    if (bg) { /* the caller reads and closes it */
        *bg = p;
        return 0;
    }
    size_t n = fread(out, 1, len - 1, p);
    out[n] = 0;
    char rest[512]; /* all of it is read: patctl never meets a closed pipe */
    while (fread(rest, 1, sizeof(rest), p) > 0)
        ;
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* patctl upgrade to a binary that fails at start: exit 1 saying so, and the old daemon serves
 * on without a gap and logs why; a good binary put at the same path (one that takes a moment to
 * start) then upgrades, a second upgrade meanwhile is refused with EALREADY, and patctl says
 * the new pid. */
static void test_upgrade_fails(void **state)
{
    (void)state;
    const char *built = getenv("PATD_BIN") ? getenv("PATD_BIN") : "build/bin/patd";
    char bdir[] = "/tmp/patd-test-bin.XXXXXX", bin[200], bad[220], slow[220], real[PATH_MAX];
    assert_non_null(mkdtemp(bdir));
    assert_non_null(realpath(built, real));
    snprintf(bin, sizeof(bin), "%s/patd", bdir);
    snprintf(bad, sizeof(bad), "%s/broken", bdir);
    snprintf(slow, sizeof(slow), "%s/slow", bdir);
    install(built, bin);
    FILE *f = fopen(bad, "w");
    assert_non_null(f);
    fputs("#!/bin/sh\necho 'a broken patd' >&2\nexit 3\n", f);
    fclose(f);
    f = fopen(slow, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\nsleep 0.5\nexec '%s' \"$@\"\n", real);
    fclose(f);
    char *was = getenv("PATD_BIN") ? strdup(getenv("PATD_BIN")) : NULL;
    setenv("PATD_BIN", bin, 1);
    tl_daemon_t d;
    const int started = tl_daemon_start_managed(&d, ARGS);
    if (was)
        setenv("PATD_BIN", was, 1);
    else
        unsetenv("PATD_BIN");
    free(was);
    assert_int_equal(started, 0);
    const pid_t old = d.pid;
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x3d));
    pid_t kid;
    FILE *in = stepper_start(&d, tl_rng_u64(&r), 0, &kid);
    steps_until(in, 10, 0);
    install(bad, bin);
    const uint64_t t_up = pat_now_ns();
    char out[1024];
    const int pst = patctl_upgrade(&d, out, sizeof(out), NULL);
    if (pst != 1 || !strstr(out, "the upgrade failed"))
        fail_msg("patctl upgrade to a broken binary: status %d, said: %s", pst, out);
    const uint64_t gap = steps_until(in, 20, t_up);
    assert_true(log_has(&d, "upgrade failed: the successor (pid"));
    assert_true(log_has(&d, "exited with status 3 before it was ready"));
    assert_int_equal(tl_daemon_status(&d, "pid"), old);
    assert_int_equal(status_line(&d, "upgrade_pid"), -1); /* none under way */
    printf("an upgrade to a broken binary: pid %d serves on; the stepping client's longest gap "
           "%.1f ms\n",
           (int)old, gap / 1e6);
    /* a good binary at the same path, slow to start: a second upgrade meanwhile is refused */
    install(slow, bin);
    FILE *bg = NULL;
    patctl_upgrade(&d, NULL, 0, &bg);
    int under_way = -1;
    for (int i = 0; i < 200 && under_way < 0; i++) {
        usleep(5000);
        under_way = (int)status_line(&d, "upgrade_pid");
    }
    assert_true(under_way > 0);
    char *text = NULL;
    assert_int_equal(pat_admin(d.sock, PAT_ADMIN_UPGRADE, 5000, &text), -EALREADY);
    pat_free(text);
    size_t n = fread(out, 1, sizeof(out) - 1, bg);
    out[n] = 0;
    char rest[512];
    while (fread(rest, 1, sizeof(rest), bg) > 0)
        ;
    const int st = pclose(bg);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    char want[64];
    snprintf(want, sizeof(want), "upgraded: pid %d serves", under_way);
    if (!strstr(out, want))
        fail_msg("patctl upgrade said: %s", out);
    steps_until(in, 10, pat_now_ns());
    fclose(in);
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    assert_int_equal(waitpid(old, NULL, 0), old);
    tl_daemon_collect(&d);
    assert_int_equal(d.pid, under_way);
    assert_true(status_line(&d, "persist_adopted") > 0);
    tl_daemon_stop(&d);
    unlink(bin);
    unlink(bad);
    unlink(slow);
    rmdir(bdir);
}

/* Without systemd: patd-keep keeps the store and starts patd again after a kill -9, and the
 * prompts published before it are served from the cache; SIGTERM to the keeper drains patd
 * and ends both with status 0. */
static void test_keeper(void **state)
{
    (void)state;
    const char *patd = getenv("PATD_BIN") ? getenv("PATD_BIN") : "build/bin/patd";
    char keep[300];
    tool_path("patd-keep", keep, sizeof(keep));
    tl_daemon_t d; /* only its directory, socket and log: the keeper starts patd */
    assert_int_equal(tl_daemon_dir(&d), 0);
    char rt[160];
    snprintf(rt, sizeof(rt), "--runtime-dir=%s", d.dir);
    pid_t kp = fork();
    if (kp == 0) {
        int fd = open(d.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 2);
        execl(keep, keep, "--restart-ms", "100", "--", patd, rt, "--metrics-port=0",
              "--backend=cpu", "--blocks=256", "--executors=2", (char *)NULL);
        _exit(127);
    }
    const int64_t first = status_pid_other(&d, 0, 200);
    assert_true(first > 0);
    tl_rng_t r;
    tl_rng_seed(&r, tl_test_seed(0x3b));
    pat_conn_t *c = connect_to(&d);
    tl_seq_t s[2];
    prompts(s, 7000);
    run(c, s, 1, &r);
    pat_close(c);
    assert_int_equal(kill((pid_t)first, SIGKILL), 0);
    const int64_t second = status_pid_other(&d, first, 400);
    assert_true(second > 0);
    assert_true(log_has(&d, "patd-keep: patd (pid"));
    assert_true(log_has(&d, "pool.persist: adopted"));
    c = connect_to(&d);
    tl_seq_t t[2];
    prompts(t, 7000);
    const uint32_t hit = run(c, t, 1, &r);
    printf("patd-keep: patd %lld killed, %lld started with the store: %u of %u prompt tokens "
           "from the cache\n",
           (long long)first, (long long)second, hit, 2 * 104);
    assert_int_equal(hit, 2 * (104 / 16) * 16);
    pat_close(c);
    /* an upgrade: the keeper follows the successor */
    assert_int_equal(kill((pid_t)second, SIGUSR2), 0);
    const int64_t third = status_pid_other(&d, second, 400);
    assert_true(third > 0);
    for (int i = 0; i < 200 && !log_has(&d, "patd-keep: patd's main process is now pid"); i++)
        usleep(10000);
    assert_true(log_has(&d, "patd-keep: patd's main process is now pid"));
    kill(kp, SIGTERM);
    int st = 0;
    assert_int_equal(waitpid(kp, &st, 0), kp);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(kill((pid_t)third, 0) < 0 && errno == ESRCH); /* drained and reaped */
    finish(&d, s, t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_restart_adopts),
        cmocka_unit_test(test_cold_starts),
        cmocka_unit_test(test_fp8_pool_restarts),
        cmocka_unit_test(test_restart_cycles),
        cmocka_unit_test(test_random_kills),
        cmocka_unit_test(test_random_kills_evicting),
        cmocka_unit_test(test_keeper),
        cmocka_unit_test(test_upgrade),
        cmocka_unit_test(test_upgrade_fails),
    };
    /* an upgrade's successor is the old daemon's child: it becomes this test's when that exits */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) {
        perror("PR_SET_CHILD_SUBREAPER");
        return 1;
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
